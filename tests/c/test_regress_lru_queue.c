/* test_regress_lru_queue.c - lru mode skips the "slots + refill_queue below
 * 2^24" check of prefetch mode. refill_queue = 4294967295 passes validation,
 * nslots + refill_queue wraps in 32 bits to fewer request records than slots,
 * and a prefetch finds no record ("cannot fail"). Checks that such a config is
 * refused, or that issuing up to slots prefetches works. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

static void try_queue(const char *qlen)
{
	struct chm_config c;
	cfg_init(&c, "backend", "ghost", "mode", "lru", "capacity", "64M", "dram", "1M", "lru_line",
	         "64K", "slot_size", "4K", "slots", "8", "refill_queue", qlen);
	if (chm_config_validate(&c, NULL, 0)) {
		printf("refill_queue=%s: refused at validation\n", qlen);
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		chm_dev *dev;
		if (chm_dev_open(&c, &dev))
			_exit(0); /* refused at open: acceptable */
		chm_handle h[8];
		int bad = 0;
		for (int i = 0; i < 8; i++)
			if (chm_prefetch_object(dev, (uint64_t)i * 4096, 4096, 0, &h[i]))
				bad++;
		for (int i = 0; i < 8; i++)
			chm_prefetch_release(dev, h[i]);
		chm_dev_close(dev);
		_exit(bad ? 3 : 0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "lru refill_queue=%s, 8 prefetches on 8 slots: child %s %d", qlen,
	      WIFSIGNALED(st) ? "killed by signal" : "exited",
	      WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	printf("refill_queue=%s: 8 prefetches on 8 slots checked\n", qlen);
}

int main(void)
{
	try_queue("4294967295");
	try_queue("4294967290");
	return check_summary();
}
