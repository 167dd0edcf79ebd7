/*
 * test_pool.c - the DRAM pool: every kind this host has, NUMA binding,
 * memfd sealing, pre-faulting, and the errno of every refusal.
 *
 * hugetlb needs huge pages: as root the test raises vm.nr_hugepages and
 * restores it afterwards, otherwise that part is skipped with the reason.
 * devdax is exercised through the FILE kind on a regular file (the same
 * open/mmap path); a character device that is not devdax must be refused.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dev.h"
#include "check.h"

#define MiB (UINT64_C(1) << 20)
/* A size no other mapping of this process has, for leak checks. */
#define ODD_SIZE (MiB + 3 * 4096)

static char tmpdir[] = "/tmp/chm-test-pool-XXXXXX";
static long saved_nr_hugepages = -1;

/* ---- host inspection, independent of pool.c ---- */

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* Mappings whose line in /proc/self/maps contains any of the markers. */
static int count_marked_maps(const char *extra)
{
	char line[4352];
	FILE *f = fopen("/proc/self/maps", "re");
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "chm-pool") || strstr(line, "anon_hugepage") ||
		    (extra && strstr(line, extra)))
			n++;
	fclose(f);
	return n;
}

/* Anonymous mappings (no inode, no name) with a size in [lo, hi]. */
static int count_anon_maps(uint64_t lo, uint64_t hi)
{
	char line[4352], name[4352];
	unsigned long s, e, inode;
	FILE *f = fopen("/proc/self/maps", "re");
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		name[0] = '\0';
		if (sscanf(line, "%lx-%lx %*s %*s %*s %lu %4351s", &s, &e, &inode, name) >= 3 &&
		    inode == 0 && name[0] == '\0' && e - s >= lo && e - s <= hi)
			n++;
	}
	fclose(f);
	return n;
}

static long meminfo(const char *key)
{
	char line[256];
	long v = -1;
	size_t klen = strlen(key);
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, klen) && line[klen] == ':')
			v = strtol(line + klen + 1, NULL, 10);
	fclose(f);
	return v;
}

static long read_long(const char *path)
{
	char buf[64];
	long v = -1;
	FILE *f = fopen(path, "re");

	if (!f)
		return -1;
	if (fgets(buf, sizeof(buf), f))
		v = strtol(buf, NULL, 10);
	fclose(f);
	return v;
}

static int write_long(const char *path, long v)
{
	FILE *f = fopen(path, "we");
	int ret;

	if (!f)
		return -errno;
	ret = fprintf(f, "%ld\n", v) < 0 ? -EIO : 0;
	if (fclose(f) && !ret)
		ret = -errno;
	return ret;
}

static bool thp_never(void)
{
	char buf[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");

	if (!f)
		return true;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	return strstr(buf, "[never]") != NULL;
}

/* kB mapped by huge pages in the mappings that overlap [p, p+len). */
static long smaps_huge_kb(const void *p, uint64_t len)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + len;
	unsigned long s, e;
	char line[4352], perms[8];
	long kb, total = 0;
	bool in = false;
	FILE *f = fopen("/proc/self/smaps", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %7s", &s, &e, perms) == 3)
			in = s < hi && e > lo;
		else if (in && (sscanf(line, "AnonHugePages: %ld", &kb) == 1 ||
		                sscanf(line, "ShmemPmdMapped: %ld", &kb) == 1 ||
		                sscanf(line, "FilePmdMapped: %ld", &kb) == 1))
			total += kb;
	}
	fclose(f);
	return total;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* Whether this kernel builds a shmem huge page on request right now: one
 * 2 MiB memfd page collapsed by hand (Linux 6.1+, shmem_enabled not deny). */
static bool shmem_collapse_works(void)
{
	const uint64_t hp = 2 * MiB;
	int fd = memfd_create("probe", MFD_CLOEXEC);
	char *raw, *p;
	bool ok = false;

	if (fd < 0 || ftruncate(fd, (off_t)hp))
		goto out;
	raw = mmap(NULL, 2 * hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		goto out;
	p = (char *)(((uintptr_t)raw + hp - 1) & ~(uintptr_t)(hp - 1));
	if (mmap(p, hp, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
		p[0] = 1;
		ok = madvise(p, hp, MADV_COLLAPSE) == 0 && smaps_huge_kb(p, hp) > 0;
	}
	munmap(raw, 2 * hp);
out:
	if (fd >= 0)
		close(fd);
	return ok;
}

static bool all_zero(const struct chm_pool *p)
{
	const char *b = p->base;

	for (uint64_t i = 0; i < p->bytes; i++)
		if (b[i])
			return false;
	return true;
}

static bool all_resident(const struct chm_pool *p)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = (p->bytes + pg - 1) / pg;
	unsigned char *vec = malloc(n);
	bool ok = vec != NULL;

	if (ok && mincore(p->base, p->bytes, vec))
		ok = false;
	for (size_t i = 0; ok && i < n; i++)
		if (!(vec[i] & 1))
			ok = false;
	free(vec);
	return ok;
}

/* Writes a position-dependent pattern over the whole pool, reads it back. */
static bool usable(const struct chm_pool *p, uint64_t from)
{
	uint64_t *w = (uint64_t *)((char *)p->base + from);
	size_t n = (p->bytes - from) / sizeof(*w);

	for (size_t i = 0; i < n; i++)
		w[i] = i * 0x9e3779b97f4a7c15ull ^ (uintptr_t)p->base;
	for (size_t i = 0; i < n; i++)
		if (w[i] != (i * 0x9e3779b97f4a7c15ull ^ (uintptr_t)p->base))
			return false;
	return true;
}

/* The range's policy is MPOL_BIND to exactly {node}, and its pages are there. */
static bool bound_to(const struct chm_pool *p, int node, char *why, size_t whylen)
{
	unsigned long mask[16];
	uint64_t offs[3] = {0, p->bytes / 2, p->bytes - 1};
	int mode = -1, where;

	memset(mask, 0, sizeof(mask));
	if (get_mempolicy(&mode, mask, 1024 + 1, p->base, MPOL_F_ADDR)) {
		snprintf(why, whylen, "get_mempolicy: %s", strerror(errno));
		return false;
	}
	if (mode != MPOL_BIND) {
		snprintf(why, whylen, "policy mode %d, want MPOL_BIND", mode);
		return false;
	}
	for (int i = 0; i < 16; i++) {
		unsigned long want = i == node / 64 ? 1ul << (node % 64) : 0;

		if (mask[i] != want) {
			snprintf(why, whylen, "nodemask word %d = %#lx", i, mask[i]);
			return false;
		}
	}
	for (int i = 0; i < 3; i++) {
		if (get_mempolicy(&where, NULL, 0, (char *)p->base + offs[i],
		                  MPOL_F_NODE | MPOL_F_ADDR)) {
			snprintf(why, whylen, "get_mempolicy(node): %s", strerror(errno));
			return false;
		}
		if (where != node) {
			snprintf(why, whylen, "page at +%llu on node %d",
			         (unsigned long long)offs[i], where);
			return false;
		}
	}
	return true;
}

static bool default_policy(const struct chm_pool *p)
{
	unsigned long mask[16];
	int mode = -1;

	return get_mempolicy(&mode, mask, 1024 + 1, p->base, MPOL_F_ADDR) == 0 &&
	       mode == MPOL_DEFAULT;
}

static struct chm_config cfg_for(int kind, int node, const char *path)
{
	struct chm_config c;

	memset(&c, 0, sizeof(c));
	c.pool_kind = kind;
	c.numa_node = node;
	if (path)
		snprintf(c.pool_path, sizeof(c.pool_path), "%s", path);
	return c;
}

static const char *kind_name(int k)
{
	static const char *const n[] = {"anon", "hugetlb", "memfd", "file"};

	return k >= 0 && k < 4 ? n[k] : "?";
}

/* A refusal with the exact errno that leaks no fd and no mapping. */
static void expect_refusal(const struct chm_config *c, uint64_t bytes, int err, const char *what)
{
	struct chm_pool p;
	int fds = count_fds(), maps = count_marked_maps(c->pool_path[0] ? c->pool_path : NULL);
	int anon = count_anon_maps(bytes, bytes + 4 * MiB);
	int ret;

	memset(&p, 0x5a, sizeof(p));
	ret = chm_pool_create(&p, c, bytes);
	CHECK(ret == err, "%s: got %d (%s), want %d (%s)", what, ret, strerror(-ret), err,
	      strerror(-err));
	if (ret == 0)
		chm_pool_destroy(&p);
	else
		CHECK(p.base == NULL && p.bytes == 0 && p.fd == -1 && p.numa_node == -1,
		      "%s: a failed create must leave an empty pool", what);
	chm_pool_destroy(&p);
	CHECK(count_fds() == fds, "%s: fd leaked", what);
	CHECK(count_marked_maps(c->pool_path[0] ? c->pool_path : NULL) == maps &&
	              count_anon_maps(bytes, bytes + 4 * MiB) == anon,
	      "%s: mapping leaked", what);
	if (ret == err)
		printf("ok   refused %-44s -> %s\n", what, strerror(-err));
}

/* ---- the tests ---- */

static void test_arguments(const char *file)
{
	struct chm_config c = cfg_for(CHM_POOL_ANON, -1, NULL);
	struct chm_pool p;

	CHECK(chm_pool_create(NULL, &c, MiB) == -EINVAL, "NULL pool");
	memset(&p, 0x5a, sizeof(p));
	CHECK(chm_pool_create(&p, NULL, MiB) == -EINVAL && p.base == NULL && p.fd == -1,
	      "NULL cfg");
	for (int k = 0; k < 4; k++) {
		char what[64];

		c = cfg_for(k, -1, k == CHM_POOL_FILE ? file : NULL);
		snprintf(what, sizeof(what), "%s, bytes 0", kind_name(k));
		expect_refusal(&c, 0, -EINVAL, what);
		c.numa_node = 9999;
		snprintf(what, sizeof(what), "%s, numa node 9999", kind_name(k));
		expect_refusal(&c, ODD_SIZE, -EINVAL, what);
		c.numa_node = -2;
		snprintf(what, sizeof(what), "%s, numa node -2", kind_name(k));
		expect_refusal(&c, ODD_SIZE, -EINVAL, what);
	}
	c = cfg_for(7, -1, NULL);
	expect_refusal(&c, MiB, -EINVAL, "unknown pool kind 7");
	for (int node = 0; node < 1024; node++) {
		char dir[64], what[64];

		snprintf(dir, sizeof(dir), "/sys/devices/system/node/node%d", node);
		if (access(dir, F_OK) == 0)
			continue;
		for (int k = 0; k < 4; k++) {
			c = cfg_for(k, node, k == CHM_POOL_FILE ? file : NULL);
			snprintf(what, sizeof(what), "%s, numa node %d (first absent)",
			         kind_name(k), node);
			expect_refusal(&c, ODD_SIZE, -EINVAL, what);
		}
		break;
	}

	chm_pool_destroy(NULL);
	memset(&p, 0, sizeof(p));
	p.fd = -1;
	chm_pool_destroy(&p);
}

static void test_anon(bool numa)
{
	struct chm_config c = cfg_for(CHM_POOL_ANON, -1, NULL);
	uint64_t want = 8 * MiB + 123;
	struct chm_pool p;
	char why[128];
	long huge;
	int ret;

	ret = chm_pool_create(&p, &c, want);
	CHECK(ret == 0, "anon create: %d", ret);
	if (ret)
		return;
	CHECK(p.base && p.bytes >= want && p.bytes % sysconf(_SC_PAGESIZE) == 0, "anon size %llu",
	      (unsigned long long)p.bytes);
	CHECK(p.kind == CHM_POOL_ANON && p.fd == -1 && p.numa_node == -1, "anon fields");
	CHECK(all_resident(&p), "anon pool not pre-faulted");
	huge = smaps_huge_kb(p.base, p.bytes);
	CHECK(p.hugepages == (huge > 0), "anon hugepages=%d but smaps shows %ld kB huge",
	      p.hugepages, huge);
	if (thp_never())
		CHECK(!p.hugepages, "THP is 'never' yet hugepages reported");
	if (p.hugepages)
		CHECK((uintptr_t)p.base % (2 * MiB) == 0, "THP pool not 2 MiB aligned");
	CHECK(numa ? default_policy(&p) : true, "unbound anon pool has a policy");
	CHECK(usable(&p, 0), "anon pattern mismatch");
	printf("ok   anon: %llu bytes, pre-faulted, usable, hugepages=%d (smaps: %ld kB in "
	       "huge pages, THP %s)\n",
	       (unsigned long long)p.bytes, p.hugepages, huge, thp_never() ? "never" : "on");
	chm_pool_destroy(&p);
	CHECK(p.base == NULL && p.fd == -1, "destroy resets the pool");
	chm_pool_destroy(&p);

	if (!numa)
		return;
	c.numa_node = 0;
	ret = chm_pool_create(&p, &c, 4 * MiB);
	CHECK(ret == 0, "anon numa 0 create: %d", ret);
	if (ret)
		return;
	CHECK(p.numa_node == 0, "anon numa_node %d", p.numa_node);
	CHECK(bound_to(&p, 0, why, sizeof(why)), "anon node 0: %s", why);
	CHECK(usable(&p, 0), "anon numa pattern mismatch");
	printf("ok   anon bound to node 0: get_mempolicy reports MPOL_BIND {0}, pages on node 0\n");
	chm_pool_destroy(&p);
}

/* The device open's anon pool: chm_pool_create_bg returns a usable pool
 * whose pre-fault runs in a thread of its own; the pool ends up resident
 * with hugepages telling what smaps shows, and destroying it at once (the
 * thread mid-way or not) stops and joins the thread. */
static void test_anon_background(void)
{
	struct chm_config c = cfg_for(CHM_POOL_ANON, -1, NULL);
	struct chm_pool p;
	int ret = chm_pool_create_bg(&p, &c, 64 * MiB);
	CHECK(ret == 0, "anon bg create: %d", ret);
	if (ret)
		return;
	CHECK(p.prefault_started, "no pre-fault thread");
	CHECK(usable(&p, 0), "anon bg pattern mismatch"); /* usable before it is done */
	bool resident = false;
	for (int i = 0; i < 1000 && !resident; i++) { /* up to 10 s */
		resident = all_resident(&p);
		if (!resident)
			usleep(10000);
	}
	CHECK(resident, "background pre-fault did not fault the pool in");
	pthread_join(p.prefault_thread, NULL); /* done: hugepages is settled */
	p.prefault_started = false;
	long huge = smaps_huge_kb(p.base, p.bytes);
	CHECK(p.hugepages == (huge > 0), "bg hugepages=%d but smaps shows %ld kB huge", p.hugepages,
	      huge);
	chm_pool_destroy(&p);
	CHECK(p.base == NULL && !p.prefault_started, "destroy resets the pool");

	ret = chm_pool_create_bg(&p, &c, 256 * MiB);
	CHECK(ret == 0, "anon bg create: %d", ret);
	chm_pool_destroy(&p); /* the thread stopped and joined, mid-way or not */
	CHECK(p.base == NULL, "destroy resets the pool");
	printf("ok   anon, background pre-fault: resident, hugepages=%d, stops on destroy\n",
	       huge > 0);
}

static void test_memfd(bool numa)
{
	struct chm_config c = cfg_for(CHM_POOL_MEMFD, numa ? 0 : -1, NULL);
	struct chm_pool p;
	struct stat st;
	char why[128], buf[64];
	int ret, fd, seals;
	void *client;

	ret = chm_pool_create(&p, &c, 4 * MiB + 1);
	CHECK(ret == 0, "memfd create: %d", ret);
	if (ret)
		return;
	fd = p.fd;
	CHECK(fd >= 0 && p.kind == CHM_POOL_MEMFD, "memfd fd %d", fd);
	CHECK(p.bytes >= 4 * MiB + 1, "memfd size");
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC, "memfd without FD_CLOEXEC");
	CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == p.bytes, "memfd size %lld",
	      (long long)st.st_size);
	seals = fcntl(fd, F_GET_SEALS);
	CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW), "seals %#x", seals);
	errno = 0;
	CHECK(ftruncate(fd, (off_t)p.bytes / 2) == -1 && errno == EPERM, "shrink after sealing: %s",
	      strerror(errno));
	errno = 0;
	CHECK(ftruncate(fd, (off_t)p.bytes * 2) == -1 && errno == EPERM, "grow after sealing: %s",
	      strerror(errno));
	CHECK(all_resident(&p), "memfd pool not pre-faulted");
	/* huge pages where the kernel builds them (see pool.c's top): two of
	 * the 4 MiB + 4 KiB, the tail page in 4 KiB */
	bool can = shmem_collapse_works();
	long huge = smaps_huge_kb(p.base, p.bytes);
	CHECK((uintptr_t)p.base % (2 * MiB) == 0, "memfd pool at %p, not 2 MiB aligned", p.base);
	CHECK(p.hugepages == (huge > 0), "memfd hugepages=%d but smaps shows %ld kB huge",
	      p.hugepages, huge);
	if (can)
		CHECK(huge == 4096,
		      "memfd pool: %ld kB in huge pages, expected 4096 (the kernel "
		      "collapses shmem here)",
		      huge);
	CHECK(all_zero(&p), "a new memfd pool is not all zero");
	CHECK(usable(&p, 0), "memfd pattern mismatch");

	/* A client's view: the same pages through the fd. */
	memcpy((char *)p.base + p.bytes - 64, "visible through the fd", 23);
	CHECK(pread(fd, buf, 23, (off_t)p.bytes - 64) == 23 &&
	              !memcmp(buf, "visible through the fd", 23),
	      "pread through the memfd");
	client = mmap(NULL, p.bytes, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(client != MAP_FAILED, "read-only client mapping: %s", strerror(errno));
	if (client != MAP_FAILED) {
		CHECK(!memcmp((char *)client + p.bytes - 64, "visible through the fd", 23),
		      "client mapping sees the pool");
		munmap(client, p.bytes);
	}
	if (numa) {
		CHECK(p.numa_node == 0, "memfd numa_node %d", p.numa_node);
		CHECK(bound_to(&p, 0, why, sizeof(why)), "memfd node 0: %s", why);
	}
	printf("ok   memfd: fd %d, CLOEXEC, sealed (ftruncate -> EPERM), shared with a "
	       "read-only mapping, pre-faulted, zero, %ld kB in huge pages (%s)%s\n",
	       fd, huge, can ? "the kernel collapses shmem" : "no shmem collapse here: 4 KiB pages",
	       numa ? ", bound to node 0" : "");
	chm_pool_destroy(&p);
	errno = 0;
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "memfd fd still open after destroy");
}

static void test_file(bool numa)
{
	char path[64], buf[32];
	struct chm_config c;
	struct chm_pool p;
	struct stat st;
	char why[128];
	int ret, fd;
	uint64_t want = 3 * MiB + 5;

	snprintf(path, sizeof(path), "%s/pool", tmpdir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(fd >= 0, "create %s", path);
	if (fd < 0)
		return;
	CHECK(pwrite(fd, "kept by the pool", 16, 0) == 16, "seed the file");
	close(fd);

	c = cfg_for(CHM_POOL_FILE, numa ? 0 : -1, path);
	ret = chm_pool_create(&p, &c, want);
	CHECK(ret == 0, "file create: %d", ret);
	if (ret)
		return;
	CHECK(p.fd >= 0 && p.kind == CHM_POOL_FILE && p.bytes >= want, "file fields");
	CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size >= want, "file extended to %lld",
	      (long long)st.st_size);
	CHECK((uint64_t)st.st_blocks * 512 >= p.bytes, "file blocks not reserved (%lld)",
	      (long long)st.st_blocks);
	CHECK(!memcmp(p.base, "kept by the pool", 16), "existing contents clobbered");
	CHECK(all_resident(&p), "file pool not pre-faulted");
	CHECK(usable(&p, 4096), "file pattern mismatch");
	memcpy((char *)p.base + 1000, "on disk", 7);
	CHECK(msync(p.base, p.bytes, MS_SYNC) == 0, "msync");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0 && pread(fd, buf, 7, 1000) == 7 && !memcmp(buf, "on disk", 7),
	      "stores reach the file");
	if (fd >= 0)
		close(fd);
	if (numa) {
		CHECK(p.numa_node == 0, "file numa_node %d", p.numa_node);
		CHECK(bound_to(&p, 0, why, sizeof(why)), "file node 0: %s", why);
	}
	printf("ok   file: extended to %lld bytes, blocks reserved, contents kept, "
	       "pre-faulted, stores reach the file%s\n",
	       (long long)st.st_size, numa ? ", bound to node 0" : "");
	chm_pool_destroy(&p);
	CHECK(stat(path, &st) == 0, "file removed by destroy");

	/* A larger file is mapped in part and not truncated. */
	CHECK(truncate(path, (off_t)(16 * MiB)) == 0, "grow file");
	c.numa_node = -1;
	ret = chm_pool_create(&p, &c, MiB);
	CHECK(ret == 0 && p.bytes == MiB, "file smaller pool: %d", ret);
	if (ret == 0)
		chm_pool_destroy(&p);
	CHECK(stat(path, &st) == 0 && st.st_size == (off_t)(16 * MiB), "file shrunk to %lld",
	      (long long)st.st_size);
	unlink(path);
}

static void test_file_refusals(void)
{
	struct chm_config c;
	char path2[64];

	c = cfg_for(CHM_POOL_FILE, -1, "");
	expect_refusal(&c, MiB, -EINVAL, "file, empty path");
	c = cfg_for(CHM_POOL_FILE, -1, "/nonexistent-chm-dir/pool");
	expect_refusal(&c, MiB, -ENOENT, "file, missing path");
	c = cfg_for(CHM_POOL_FILE, -1, tmpdir);
	expect_refusal(&c, MiB, -EISDIR, "file, a directory");
	snprintf(path2, sizeof(path2), "%s/fifo", tmpdir);
	CHECK(mkfifo(path2, 0600) == 0, "mkfifo");
	c = cfg_for(CHM_POOL_FILE, -1, path2);
	expect_refusal(&c, MiB, -EINVAL, "file, a FIFO");
	unlink(path2);
	c = cfg_for(CHM_POOL_FILE, -1, "/dev/null");
	expect_refusal(&c, MiB, -EINVAL, "file, a char device that is not devdax");
	c = cfg_for(CHM_POOL_FILE, -1, NULL);
	memset(c.pool_path, 'a', sizeof(c.pool_path));
	expect_refusal(&c, MiB, -EINVAL, "file, unterminated path");
}

/*
 * A pool file on a full filesystem is -ENOSPC at create time, not SIGBUS on
 * a later store: run in a child with a private mount namespace holding a
 * 1 MiB tmpfs, so nothing is left mounted whatever happens.
 */
static void test_file_enospc(void)
{
	char dir[64], path[96];
	pid_t pid;
	int status;

	snprintf(dir, sizeof(dir), "%s/small", tmpdir);
	if (mkdir(dir, 0700)) {
		printf("skip file -ENOSPC: mkdir: %s\n", strerror(errno));
		return;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct chm_config c;
		struct chm_pool p;
		int fd, ret;

		if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount("chm-test", dir, "tmpfs", 0, "size=1m")) {
			printf("skip file -ENOSPC: cannot mount a small tmpfs: %s\n",
			       strerror(errno));
			_exit(77);
		}
		snprintf(path, sizeof(path), "%s/pool", dir);
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			_exit(1);
		close(fd);
		c = cfg_for(CHM_POOL_FILE, -1, path);
		ret = chm_pool_create(&p, &c, 4 * MiB);
		if (ret == 0)
			chm_pool_destroy(&p);
		printf("%s file on a full filesystem -> %d (%s), want -ENOSPC\n",
		       ret == -ENOSPC ? "ok  " : "FAIL", ret, strerror(-ret));
		_exit(ret == -ENOSPC ? 0 : 1);
	}
	CHECK(pid > 0, "fork: %s", strerror(errno));
	if (pid > 0) {
		CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
		CHECK(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
		      "file -ENOSPC child: status %#x", status);
	}
	rmdir(dir);
}

static void restore_hugepages(void)
{
	if (saved_nr_hugepages >= 0) {
		write_long("/proc/sys/vm/nr_hugepages", saved_nr_hugepages);
		saved_nr_hugepages = -1;
	}
}

static void test_hugetlb(bool numa)
{
	long hp_kb = meminfo("Hugepagesize"), nr, avail, free_before, overcommit;
	uint64_t hps, want = 5 * MiB;
	struct chm_config c = cfg_for(CHM_POOL_HUGETLB, -1, NULL);
	struct chm_pool p;
	char why[128];
	int ret;

	if (hp_kb <= 0) {
		printf("skip hugetlb: no Hugepagesize in /proc/meminfo\n");
		return;
	}
	hps = (uint64_t)hp_kb * 1024;
	overcommit = read_long("/proc/sys/vm/nr_overcommit_hugepages");
	avail = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd");
	if (overcommit == 0 && avail >= 0) {
		char what[64];

		snprintf(what, sizeof(what), "hugetlb, %ld pages but %ld free", avail + 1, avail);
		expect_refusal(&c, (uint64_t)(avail + 1) * hps, -ENOMEM, what);
	} else {
		printf("skip hugetlb -ENOMEM check: nr_overcommit_hugepages=%ld\n", overcommit);
	}

	if (geteuid() != 0) {
		printf("skip hugetlb pool: not root, cannot raise vm.nr_hugepages\n");
		return;
	}
	nr = read_long("/proc/sys/vm/nr_hugepages");
	if (nr < 0) {
		printf("skip hugetlb pool: /proc/sys/vm/nr_hugepages unreadable\n");
		return;
	}
	saved_nr_hugepages = nr;
	if (write_long("/proc/sys/vm/nr_hugepages", nr + 8)) {
		restore_hugepages();
		printf("skip hugetlb pool: cannot write vm.nr_hugepages\n");
		return;
	}
	free_before = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd");
	if (free_before < 6) {
		restore_hugepages();
		printf("skip hugetlb pool: the kernel found only %ld free huge pages\n",
		       free_before);
		return;
	}

	ret = chm_pool_create(&p, &c, want);
	CHECK(ret == 0, "hugetlb create: %d", ret);
	if (ret == 0) {
		uint64_t pages = CHM_ALIGN_UP(want, hps) / hps;
		long used = free_before - meminfo("HugePages_Free");

		CHECK(p.bytes == CHM_ALIGN_UP(want, hps), "hugetlb rounded to %llu",
		      (unsigned long long)p.bytes);
		CHECK(p.hugepages && p.fd == -1 && p.numa_node == -1, "hugetlb fields");
		CHECK(used == (long)pages, "pre-fault took %ld huge pages, want %llu", used,
		      (unsigned long long)pages);
		CHECK(all_resident(&p), "hugetlb pool not resident");
		CHECK(usable(&p, 0), "hugetlb pattern mismatch");
		printf("ok   hugetlb: %llu bytes requested -> %llu (%llu x %ld kB pages, all "
		       "faulted in), usable\n",
		       (unsigned long long)want, (unsigned long long)p.bytes,
		       (unsigned long long)pages, hp_kb);
		chm_pool_destroy(&p);
		CHECK(meminfo("HugePages_Free") - meminfo("HugePages_Rsvd") == free_before,
		      "huge pages not returned by destroy");
	}
	if (numa) {
		c.numa_node = 0;
		ret = chm_pool_create(&p, &c, 2 * hps);
		CHECK(ret == 0, "hugetlb numa 0 create: %d", ret);
		if (ret == 0) {
			CHECK(p.numa_node == 0, "hugetlb numa_node %d", p.numa_node);
			CHECK(bound_to(&p, 0, why, sizeof(why)), "hugetlb node 0: %s", why);
			CHECK(usable(&p, 0), "hugetlb numa pattern mismatch");
			printf("ok   hugetlb bound to node 0\n");
			chm_pool_destroy(&p);
		}
	}
	restore_hugepages();
	CHECK(read_long("/proc/sys/vm/nr_hugepages") == nr, "vm.nr_hugepages not restored");
	printf("ok   vm.nr_hugepages restored to %ld\n", nr);
}

int main(void)
{
	char path[64];
	bool numa = access("/sys/devices/system/node/node0", F_OK) == 0;
	int fd;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	atexit(restore_hugepages);
	if (!numa)
		printf("skip NUMA binding checks: no /sys/devices/system/node/node0\n");

	snprintf(path, sizeof(path), "%s/args", tmpdir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	test_arguments(path);
	unlink(path);

	test_anon(numa);
	test_anon_background();
	test_memfd(false);
	if (numa)
		test_memfd(true);
	printf("note devdax: no /dev/dax* on this host; the FILE kind is exercised through "
	       "a regular file\n");
	test_file(false);
	if (numa)
		test_file(true);
	test_file_refusals();
	test_file_enospc();
	test_hugetlb(numa);

	rmdir(tmpdir);
	return check_summary();
}
