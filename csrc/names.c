/* names.c - the names of the API's public enumerations, declared once: the
 * option parser (config.c) and every binding (chm/_lowlevel.py builds its
 * tables from chm_enum_name) read them from here, so no name is typed twice.
 * (The internal state machines' names are states.c's, chm_state_name.)
 *
 * Each table is indexed by the enum's value (designated initializers), so a
 * value renumbered in chm.h moves its name with it. */
#include <errno.h>
#include <stddef.h>
#include <strings.h>

#include "chm.h"
#include "errdetail.h"
#include "names.h"

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
static const char *const *const tables[] = {
        [CHM_ENUM_BACKEND] = chm_backend_names, [CHM_ENUM_MODE] = chm_mode_names,
        [CHM_ENUM_POOL] = chm_pool_names,       [CHM_ENUM_CLOCK] = chm_clock_names,
        [CHM_ENUM_FAULT] = fault_names,
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
