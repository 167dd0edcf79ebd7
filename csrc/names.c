/* names.c - the names of the API's enumerations, declared once: the option
 * parser (config.c) and every binding (chm/_lowlevel.py builds its tables
 * from chm_enum_name) read them from here, so no name is typed twice.
 *
 * Each table is indexed by the enum's value (designated initializers), so a
 * value renumbered in chm.h or states.h moves its name with it. */
#include <errno.h>
#include <stddef.h>
#include <strings.h>

#include "chm.h"
#include "errdetail.h"
#include "names.h"
#include "states.h"

const char *const chm_backend_names[] = {
        [CHM_BACKEND_URING] = "uring",
        [CHM_BACKEND_PREAD] = "pread",
        [CHM_BACKEND_GHOST] = "ghost",
        NULL,
};
const char *const chm_mode_names[] = {
        [CHM_MODE_PREFETCH] = "prefetch",
        [CHM_MODE_LRU] = "lru",
        [CHM_MODE_DIRECT] = "direct",
        NULL,
};
const char *const chm_pool_names[] = {
        [CHM_POOL_ANON] = "anon",
        [CHM_POOL_HUGETLB] = "hugetlb",
        [CHM_POOL_MEMFD] = "memfd",
        [CHM_POOL_FILE] = "file",
        NULL,
};
const char *const chm_clock_names[] = {
        [CHM_CLOCK_REAL] = "real",
        [CHM_CLOCK_VIRTUAL] = "virtual",
        NULL,
};
static const char *const fault_names[] = {
        [CHM_FAULT_NONE] = "none",           [CHM_FAULT_EIO_READ] = "eio_read",
        [CHM_FAULT_EIO_WRITE] = "eio_write", [CHM_FAULT_SHORT_READ] = "short_read",
        [CHM_FAULT_SLOW] = "slow",           NULL,
};
static const char *const slot_state_names[] = {
        [CHM_SLOT_FREE] = "free",
        [CHM_SLOT_FILLING] = "filling",
        [CHM_SLOT_READY] = "ready",
        [CHM_SLOT_HELD] = "held",
        [CHM_SLOT_FAILED] = "failed",
        [CHM_SLOT_DRAINING] = "draining",
        NULL,
};
static const char *const wbuf_state_names[] = {
        [CHM_WB_FREE] = "free",         [CHM_WB_ADMITTED] = "admitted",
        [CHM_WB_FLUSHING] = "flushing", [CHM_WB_DURABLE] = "durable",
        [CHM_WB_SKIPPED] = "skipped",   NULL,
};
static const char *const line_state_names[] = {
        [CHM_LINE_INVALID] = "invalid",
        [CHM_LINE_CLEAN] = "clean",
        [CHM_LINE_DIRTY] = "dirty",
        [CHM_LINE_WRITING_BACK] = "writing_back",
        NULL,
};

static const char *const *const tables[] = {
        [CHM_ENUM_BACKEND] = chm_backend_names,   [CHM_ENUM_MODE] = chm_mode_names,
        [CHM_ENUM_POOL] = chm_pool_names,         [CHM_ENUM_CLOCK] = chm_clock_names,
        [CHM_ENUM_FAULT] = fault_names,           [CHM_ENUM_SLOT_STATE] = slot_state_names,
        [CHM_ENUM_WBUF_STATE] = wbuf_state_names, [CHM_ENUM_LINE_STATE] = line_state_names,
};

#define NTABLES (int)(sizeof(tables) / sizeof(tables[0]))

const char *const *chm_enum_names(int kind)
{
	return kind >= 0 && kind < NTABLES ? tables[kind] : NULL;
}

const char *chm_enum_name(int kind, int value)
{
	const char *const *names = chm_enum_names(kind);
	if (!names || value < 0)
		return NULL;
	for (int i = 0; names[i]; i++)
		if (i == value)
			return names[i];
	return NULL;
}

int chm_enum_value(int kind, const char *name)
{
	chm_detail_clear();
	const char *const *names = chm_enum_names(kind);
	if (!names || !name)
		return chm_detail(-EINVAL, "enum_value: %s", !names ? "unknown kind" : "NULL name");
	for (int i = 0; names[i]; i++)
		if (!strcasecmp(names[i], name))
			return i;
	return chm_detail(-ENOENT, "enum_value: '%.64s' is not a name of kind %d", name, kind);
}
