/*
 * pool.c - the device's internal DRAM: one mapping of one of four kinds.
 *
 *   CHM_POOL_ANON     private anonymous memory, aligned to the THP size and
 *                     advised MADV_HUGEPAGE
 *   CHM_POOL_HUGETLB  private MAP_HUGETLB memory, rounded up to the default
 *                     huge page size (/proc/meminfo Hugepagesize)
 *   CHM_POOL_MEMFD    a memfd "chm-pool" mapped shared and sealed against
 *                     shrinking and growing, so a daemon can pass it to clients;
 *                     mapped at a THP-aligned address and collapsed into huge
 *                     pages (below)
 *   CHM_POOL_FILE     a shared mapping of cfg->pool_path: a regular file
 *                     (extended, and its blocks allocated, so a full
 *                     filesystem is -ENOSPC here rather than SIGBUS on a later
 *                     store) or a devdax character device mapped as it is
 *
 * Setup order: backing object, mapping, seals, advice, NUMA policy, pre-fault;
 * teardown undoes it in reverse. The policy is set before the first touch, so
 * pages are allocated on the chosen node. Page cache follows the task's
 * policy rather than the mapping's, so a regular-file pool is migrated after
 * pre-faulting (best effort: pages shared with other mappers stay). devdax
 * memory cannot move: numa_node must be the device's target_node.
 * Pre-faulting (MADV_POPULATE_WRITE, or touching each page on kernels
 * without it) keeps page faults out of the first pass over the pool.
 * pool->hugepages reports what /proc/self/smaps shows was obtained, not what
 * was advised.
 *
 * A memfd pool is shmem, whose huge pages follow
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled, "never" on many hosts:
 * MADV_HUGEPAGE alone then leaves it in 4 KiB pages. Every O_DIRECT read into
 * it then spans one segment per page (a 1 MiB stripe unit is 256 segments,
 * split into several requests by the block layer) and every copy out of it
 * walks 4 KiB page tables: measured, an embedded device staged 0.6x as fast
 * from a 4 KiB memfd pool as from an anonymous THP pool (docs/daemon.md,
 * "Staged reads"). So collapse_shared() touches one page per huge page and
 * asks MADV_COLLAPSE (Linux 6.1+, which ignores shmem_enabled except "deny")
 * to build each huge page, best effort: a kernel without it, or with no huge
 * page free, leaves the 4 KiB pages the pre-fault then fills in. Clients
 * mapping the same memfd at an aligned address get PMD mappings of it too.
 *
 * Pre-faulting is nearly all kernel page zeroing (clear_page; in a VM also
 * the host backing guest pages on first touch): 0.05 s to several seconds
 * for the default 320 MiB, whatever the capacity. The device open
 * (chm_pool_create_bg) leaves it to a thread of the pool's own for an anon
 * pool, in 16 MiB steps, so open returns at once and a first pass that
 * overtakes it just faults its pages itself; memfd, file and hugetlb pools
 * (shared with clients, or reserved) are still pre-faulted before open
 * returns. An anon pool's memory is committed by its mmap, not by the
 * pre-fault, so a host that cannot hold it still fails the open.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dev.h"

#define POOL_MAX_NODES 1024 /* the kernel's largest MAX_NUMNODES */
#define POOL_MAX_BYTES (UINT64_C(1) << 56)
#define POOL_THP_DEFAULT (UINT64_C(2) << 20)

static int read_text(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	if (n < 0)
		n = -errno;
	close(fd);
	if (n < 0)
		return (int)n;
	buf[n] = '\0';
	return 0;
}

static int read_u64(const char *path, uint64_t *out)
{
	char buf[64], *end;
	unsigned long long v;
	int ret = read_text(path, buf, sizeof(buf));

	if (ret)
		return ret;
	errno = 0;
	v = strtoull(buf, &end, 10);
	if (errno || end == buf)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Default huge page size from /proc/meminfo ("Hugepagesize: 2048 kB"). */
static int hugetlb_page_size(uint64_t *out)
{
	char line[256];
	unsigned long long kb;
	FILE *f = fopen("/proc/meminfo", "re");
	int ret = -EOPNOTSUPP;

	if (!f)
		return -EOPNOTSUPP;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Hugepagesize: %llu kB", &kb) == 1 && kb) {
			*out = (uint64_t)kb * 1024;
			ret = 0;
			break;
		}
	}
	fclose(f);
	return ret;
}

static bool thp_enabled(void)
{
	char buf[128];

	if (read_text("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof(buf)))
		return false;
	return !strstr(buf, "[never]");
}

static uint64_t thp_size(void)
{
	uint64_t sz;

	if (read_u64("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", &sz) || !sz ||
	    (sz & (sz - 1)))
		return POOL_THP_DEFAULT;
	return sz;
}

/*
 * Huge-page-mapped kB of [base, base+len) according to /proc/self/smaps
 * (anonymous THP, shmem and file PMD mappings). Returns 0 or -errno.
 */
static int smaps_huge_kb(const void *base, uint64_t len, uint64_t *kb_out)
{
	uintptr_t lo = (uintptr_t)base, hi = lo + len;
	unsigned long vs, ve;
	unsigned long long kb;
	bool inside = false;
	uint64_t total = 0;
	char line[4352]; /* a header line holds a path of up to PATH_MAX */
	FILE *f = fopen("/proc/self/smaps", "re");

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char perms[8];

		if (sscanf(line, "%lx-%lx %7s", &vs, &ve, perms) == 3) {
			inside = vs < hi && ve > lo;
			continue;
		}
		if (!inside)
			continue;
		if (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 ||
		    sscanf(line, "ShmemPmdMapped: %llu kB", &kb) == 1 ||
		    sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1)
			total += kb;
	}
	fclose(f);
	*kb_out = total;
	return 0;
}

/* -EINVAL for a node this host does not have, -EOPNOTSUPP without NUMA. */
static int numa_node_check(int node)
{
	char path[64];

	if (node >= POOL_MAX_NODES)
		return -EINVAL;
	if (access("/sys/devices/system/node", F_OK))
		return -EOPNOTSUPP;
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d", node);
	if (access(path, F_OK))
		return -EINVAL;
	return 0;
}

static int numa_bind(void *base, uint64_t len, int node, unsigned flags)
{
	unsigned long mask[POOL_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
	const unsigned bits = 8 * sizeof(unsigned long);

	mask[node / bits] = 1UL << (node % bits);
	if (mbind(base, len, MPOL_BIND, mask, POOL_MAX_NODES + 1, flags) == 0)
		return 0;
	if (errno == ENOSYS)
		return -EOPNOTSUPP;
	return -errno;
}

static int prefault(struct chm_pool *pool)
{
	volatile char *p = pool->base;
	long pg = sysconf(_SC_PAGESIZE);

	if (madvise(pool->base, pool->bytes, MADV_POPULATE_WRITE) == 0)
		return 0;
	if (errno == EFAULT || errno == EHWPOISON)
		return -ENOMEM;
	if (errno != EINVAL)
		return -errno;
	for (uint64_t off = 0; off < pool->bytes; off += (uint64_t)pg)
		p[off] = p[off];
	return 0;
}

/* devdax size, alignment and node from /sys/dev/char/M:m; -EINVAL if the
 * character device is not a devdax device. */
static int devdax_geometry(dev_t rdev, uint64_t *size, uint64_t *align, int *node)
{
	char path[96], link[256];
	const char *sub;
	ssize_t n;
	uint64_t v;

	snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/subsystem", major(rdev), minor(rdev));
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return -EINVAL;
	link[n] = '\0';
	sub = strrchr(link, '/');
	if (strcmp(sub ? sub + 1 : link, "dax"))
		return -EINVAL;
	snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/size", major(rdev), minor(rdev));
	if (read_u64(path, size))
		return -EINVAL;
	snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/align", major(rdev), minor(rdev));
	*align = (read_u64(path, &v) || !v) ? POOL_THP_DEFAULT : v;
	snprintf(path, sizeof(path), "/sys/dev/char/%u:%u/target_node", major(rdev), minor(rdev));
	*node = read_u64(path, &v) ? -1 : (int)v;
	return 0;
}

/* Private anonymous memory of len bytes whose start is aligned to align. */
static void *map_anon_aligned(uint64_t len, uint64_t align, int extra_flags)
{
	uint64_t span = len + align;
	char *raw, *base, *end;

	raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags,
	           -1, 0);
	if (raw == MAP_FAILED)
		return MAP_FAILED;
	base = (char *)CHM_ALIGN_UP((uintptr_t)raw, align);
	end = base + len;
	if (base > raw)
		munmap(raw, base - raw);
	if (raw + span > end)
		munmap(end, raw + span - end);
	return base;
}

/* A shared mapping of fd's first len bytes whose start is aligned to align:
 * the file mapped over an aligned anonymous reservation of its size. */
static void *map_shared_aligned(int fd, uint64_t len, uint64_t align)
{
	void *base = map_anon_aligned(len, align, MAP_NORESERVE);

	if (base == MAP_FAILED)
		return MAP_FAILED;
	if (mmap(base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		munmap(base, len);
		return MAP_FAILED;
	}
	return base;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* Best effort: the huge pages of a shared (shmem) pool, see the top. The
 * pages stay zero: each touch writes the zero it reads. */
static void collapse_shared(struct chm_pool *pool, uint64_t hp_size)
{
	volatile char *p = pool->base;
	uint64_t len = CHM_ALIGN_DOWN(pool->bytes, hp_size);

	if (!len || (uintptr_t)pool->base % hp_size)
		return;
	for (uint64_t off = 0; off < len; off += hp_size)
		p[off] = p[off];
	(void)madvise(pool->base, len, MADV_COLLAPSE);
}

/* Opens cfg->pool_path and sizes it; sets pool->fd and pool->bytes. */
static int open_pool_file(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes,
                          bool *is_dax, int *dax_node)
{
	uint64_t len = CHM_ALIGN_UP(bytes, (uint64_t)sysconf(_SC_PAGESIZE));
	uint64_t dax_size, dax_align;
	struct stat st;
	int fd, ret;

	if (cfg->pool_path[0] == '\0' || !memchr(cfg->pool_path, '\0', CHM_PATH_MAX))
		return -EINVAL;
	fd = open(cfg->pool_path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto close_fd;
	}
	if (S_ISREG(st.st_mode)) {
		*is_dax = false;
		if ((uint64_t)st.st_size < len && ftruncate(fd, (off_t)len)) {
			ret = -errno;
			goto close_fd;
		}
		if (fallocate(fd, 0, 0, (off_t)len) && errno != EOPNOTSUPP) {
			ret = -errno;
			goto close_fd;
		}
	} else if (S_ISCHR(st.st_mode)) {
		*is_dax = true;
		ret = devdax_geometry(st.st_rdev, &dax_size, &dax_align, dax_node);
		if (ret)
			goto close_fd;
		len = CHM_ALIGN_UP(bytes, dax_align);
		if (dax_size < len) {
			ret = -ENOSPC;
			goto close_fd;
		}
	} else {
		ret = -EINVAL;
		goto close_fd;
	}
	pool->fd = fd;
	pool->bytes = len;
	return 0;

close_fd:
	close(fd);
	return ret;
}

static void pool_reset(struct chm_pool *pool, int kind)
{
	pool->base = NULL;
	pool->bytes = 0;
	pool->kind = kind;
	pool->fd = -1;
	pool->numa_node = -1;
	pool->hugepages = false;
	pool->prefault_started = false;
	atomic_store(&pool->prefault_stop, false);
}

#define PREFAULT_STEP (16ull << 20)

/* The background pre-fault: the pool in steps (stopping early when the
 * pool is destroyed), then what smaps shows of huge pages. A failed step
 * ends it: those pages fault on first use instead. */
static void *prefault_run(void *arg)
{
	struct chm_pool *pool = arg;
	uint64_t kb;
	for (uint64_t off = 0; off < pool->bytes; off += PREFAULT_STEP) {
		if (atomic_load(&pool->prefault_stop))
			return NULL;
		uint64_t n = pool->bytes - off < PREFAULT_STEP ? pool->bytes - off : PREFAULT_STEP;
		struct chm_pool part = {.base = (char *)pool->base + off, .bytes = n};
		if (prefault(&part))
			return NULL;
	}
	if (smaps_huge_kb(pool->base, pool->bytes, &kb) == 0)
		__atomic_store_n(&pool->hugepages, kb > 0, __ATOMIC_RELAXED);
	return NULL;
}

static int pool_create(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes,
                       bool bg);

int chm_pool_create(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes)
{
	return pool_create(pool, cfg, bytes, false);
}

int chm_pool_create_bg(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes)
{
	return pool_create(pool, cfg, bytes, true);
}

static int pool_create(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes, bool bg)
{
	uint64_t page, kb, hp_size = 0;
	bool thp = false, is_dax = false;
	int node, dax_node = -1, ret;
	void *base;

	if (!pool)
		return -EINVAL;
	pool_reset(pool, cfg ? cfg->pool_kind : CHM_POOL_ANON);
	if (!cfg || bytes == 0)
		return -EINVAL;
	if (bytes > POOL_MAX_BYTES)
		return -ENOMEM;
	node = cfg->numa_node;
	if (node < -1)
		return -EINVAL;
	if (node >= 0) {
		ret = numa_node_check(node);
		if (ret)
			return ret;
	}
	page = (uint64_t)sysconf(_SC_PAGESIZE);
	/* ghost moves no data: a terabyte-scale simulation's DRAM is only
	 * address space, faulted in where views are actually touched */
	bool lazy = cfg->backend == CHM_BACKEND_GHOST && cfg->pool_kind == CHM_POOL_ANON;

	switch (cfg->pool_kind) {
	case CHM_POOL_ANON:
		pool->bytes = CHM_ALIGN_UP(bytes, page);
		thp = thp_enabled();
		hp_size = thp_size();
		base = map_anon_aligned(pool->bytes, thp ? hp_size : page,
		                        lazy ? MAP_NORESERVE : 0);
		if (base == MAP_FAILED) {
			ret = -ENOMEM;
			goto close_fd;
		}
		break;
	case CHM_POOL_HUGETLB:
		ret = hugetlb_page_size(&hp_size);
		if (ret)
			goto close_fd;
		pool->bytes = CHM_ALIGN_UP(bytes, hp_size);
		base = mmap(NULL, pool->bytes, PROT_READ | PROT_WRITE,
		            MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
		if (base == MAP_FAILED) {
			ret = -ENOMEM;
			goto close_fd;
		}
		break;
	case CHM_POOL_MEMFD:
		pool->bytes = CHM_ALIGN_UP(bytes, page);
		pool->fd = memfd_create("chm-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (pool->fd < 0) {
			ret = errno == ENOSYS ? -EOPNOTSUPP : -errno;
			goto close_fd;
		}
		if (ftruncate(pool->fd, (off_t)pool->bytes)) {
			ret = errno == EFBIG ? -ENOMEM : -errno;
			goto close_fd;
		}
		hp_size = thp_size();
		base = map_shared_aligned(pool->fd, pool->bytes, hp_size);
		if (base == MAP_FAILED) {
			ret = -ENOMEM;
			goto close_fd;
		}
		break;
	case CHM_POOL_FILE:
		ret = open_pool_file(pool, cfg, bytes, &is_dax, &dax_node);
		if (ret)
			goto close_fd;
		base = mmap(NULL, pool->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pool->fd, 0);
		if (base == MAP_FAILED) {
			ret = -errno;
			goto close_fd;
		}
		break;
	default: ret = -EINVAL; goto close_fd;
	}
	pool->base = base;

	if (pool->kind == CHM_POOL_MEMFD &&
	    fcntl(pool->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) {
		ret = -errno;
		goto unmap;
	}
	if ((pool->kind == CHM_POOL_ANON && thp) || pool->kind == CHM_POOL_MEMFD)
		madvise(pool->base, pool->bytes, MADV_HUGEPAGE);

	if (node >= 0 && is_dax) {
		if (dax_node != node) {
			ret = -EINVAL;
			goto unmap;
		}
		pool->numa_node = node;
	} else if (node >= 0) {
		ret = numa_bind(pool->base, pool->bytes, node, 0);
		if (ret)
			goto unmap;
		pool->numa_node = node;
	}

	/* the anon pool's open-time pre-fault goes to a thread (see the top) */
	bool later = bg && !lazy && pool->kind == CHM_POOL_ANON;
	if (pool->kind == CHM_POOL_MEMFD)
		collapse_shared(pool, hp_size);
	ret = lazy || later ? 0 : prefault(pool);
	if (ret)
		goto unmap;
	if (node >= 0 && pool->kind == CHM_POOL_FILE && !is_dax)
		numa_bind(pool->base, pool->bytes, node, MPOL_MF_MOVE);

	if (pool->kind == CHM_POOL_HUGETLB)
		pool->hugepages = true;
	else if (!lazy && !later && smaps_huge_kb(pool->base, pool->bytes, &kb) == 0)
		pool->hugepages = kb > 0;
	else
		pool->hugepages = pool->kind == CHM_POOL_ANON && thp && pool->bytes >= hp_size;
	if (later) {
		pool->prefault_started =
		        pthread_create(&pool->prefault_thread, NULL, prefault_run, pool) == 0;
		if (!pool->prefault_started) /* no thread: here, as chm_pool_create */
			prefault_run(pool);
	}
	return 0;

unmap:
	munmap(pool->base, pool->bytes);
close_fd:
	if (pool->fd >= 0)
		close(pool->fd);
	pool_reset(pool, cfg->pool_kind);
	return ret;
}

void chm_pool_destroy(struct chm_pool *pool)
{
	if (!pool || !pool->base)
		return;
	if (pool->prefault_started) {
		atomic_store(&pool->prefault_stop, true);
		pthread_join(pool->prefault_thread, NULL);
		pool->prefault_started = false;
	}
	munmap(pool->base, pool->bytes);
	if (pool->fd >= 0)
		close(pool->fd);
	pool_reset(pool, pool->kind);
}
