# chm: the two quick-start commands are `make demo` and `make test`.
# Both install what is missing first (scripts/setup.sh).

PYTHON ?= python3
VENV ?= .venv
ifeq ($(origin CC),default)
CC := gcc
endif
export PYTHON VENV

# -D_GNU_SOURCE= (empty) matches a source's own `#define _GNU_SOURCE` exactly,
# so files that define it themselves do not trip -Werror.
CFLAGS_BASE := -std=gnu11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE= -Iinclude -Icsrc
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
LIBS := -luring -lnuma -lpthread -lm

BUILD := build/c
CSRC := $(sort $(wildcard csrc/*.c))
HDRS := $(wildcard include/*.h csrc/*.h)
CTESTS := $(sort $(wildcard tests/c/test_*.c))
# The slow tier: a C test whose source has a line `/* tier: slow */` runs in
# `make test-all`, not in `make test`.
CTESTS_SLOW := $(sort $(shell grep -l '^/\* tier: slow \*/' $(CTESTS) 2>/dev/null))
CTESTS_FAST := $(filter-out $(CTESTS_SLOW),$(CTESTS))
CFORMAT := $(wildcard csrc/*.c csrc/*.h include/*.h tests/c/*.c tests/c/*.h chm/*.c)
# How many jobs the tests use: compilers and C test programs (make -j, CHM_CTEST_JOBS)
# and pytest-xdist workers. The C programs and compilers are CPU-bound: one per
# CPU. Many pytest tests wait on daemons, timers and subprocesses: two workers
# per CPU keep the CPUs busy.
NPROC := $(shell nproc 2>/dev/null || echo 1)
JOBS ?= $(NPROC)
PYTEST_JOBS ?= $(shell echo $$(( $(NPROC) * 2 )))

OBJ_plain := $(patsubst csrc/%.c,$(BUILD)/plain/obj/%.o,$(CSRC))
OBJ_san := $(patsubst csrc/%.c,$(BUILD)/san/obj/%.o,$(CSRC))
BIN_plain := $(patsubst tests/c/%.c,$(BUILD)/plain/%,$(CTESTS))
BIN_san := $(patsubst tests/c/%.c,$(BUILD)/san/%,$(CTESTS))
OBJ_tsan := $(patsubst csrc/%.c,$(BUILD)/tsan/obj/%.o,$(CSRC))
BIN_tsan := $(patsubst tests/c/%.c,$(BUILD)/tsan/%,$(CTESTS))
c_bins = $(foreach v,plain san tsan,$(patsubst tests/c/%.c,$(BUILD)/$(v)/%,$(1)))
c_bins_in = $(foreach v,$(2),$(patsubst tests/c/%.c,$(BUILD)/$(v)/%,$(1)))


.PHONY: all demo test test-all c-tests-slow pytest-slow pytest-workers pytest-engines setup setup-runtime integrations ext c-build c-tests pytest lint lint-py lint-c format clean distclean

all: setup

## demo: install what is missing to run chm (not the test tools), then run
## the embedded-device demo
demo: setup-runtime
	$(VENV)/bin/chm-emu demo

## test: install what is missing, then the lint (ruff, mypy, clang-format)
## beside the fast C tests (plain and ASan/UBSan builds; -O: each one's output
## whole), then pytest without the slow tier; any failure fails the whole run.
## The engines' pytest process (mostly waiting on the engines' child
## processes) starts with the lint and C tests and its output comes last.
## The TSan builds run in test-all (CI runs both)
test: setup
	@$(MAKE) --no-print-directory ext || exit 1; \
	rc=0; log=$$(mktemp); \
	$(MAKE) --no-print-directory pytest-engines >"$$log" 2>&1 & engines=$$!; \
	$(MAKE) --no-print-directory -k -j$(JOBS) -O lint-py lint-c c-tests || rc=1; \
	$(MAKE) --no-print-directory pytest-workers || rc=1; \
	wait $$engines || rc=1; cat "$$log"; rm -f "$$log"; \
	exit $$rc

## test-all: the slow tier that `make test` leaves out (the C tests' TSan
## builds, C tests marked `/* tier: slow */`, pytest -m slow); CI runs both
test-all: setup
	@rc=0; \
	$(MAKE) --no-print-directory -j$(JOBS) c-tests-slow || rc=1; \
	$(MAKE) --no-print-directory pytest-slow || rc=1; \
	exit $$rc

## setup: what `make test` needs (system packages, .venv with chm and its test tools)
setup:
	@scripts/setup.sh test

## integrations: install the serving engines (EXTRAS=lmcache,vllm,sglang; default
## lmcache) with a CPU build of torch (PyPI's Linux wheels are CUDA builds: a
## local wheel or TORCH_INDEX=https://download.pytorch.org/whl/cpu), for tests/integration/test_integration_*.py; about
## 2 GB of downloads for all three, and the venv grows to about 4 GB
integrations: setup
	@scripts/integrations.sh

## setup-runtime: what `make demo` needs (system packages, .venv with chm)
setup-runtime:
	@scripts/setup.sh runtime

## ext: rebuild the cffi extension in place after C changes
ext:
	@scripts/build-ext.sh

# ---- C tests: each tests/c/test_*.c is a program linked with the whole core

$(BUILD)/plain/obj/%.o: csrc/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) -c $< -o $@

$(BUILD)/san/obj/%.o: csrc/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $(SAN_FLAGS) -c $< -o $@

$(BUILD)/tsan/obj/%.o: csrc/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $(TSAN_FLAGS) -c $< -o $@

$(BUILD)/tsan/libchm.a: $(OBJ_tsan)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tsan/test_%: tests/c/test_%.c $(BUILD)/tsan/libchm.a $(HDRS)
	$(CC) $(CFLAGS_BASE) $(TSAN_FLAGS) $< $(BUILD)/tsan/libchm.a $(LIBS) -o $@

$(BUILD)/plain/libchm.a: $(OBJ_plain)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/san/libchm.a: $(OBJ_san)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/plain/test_%: tests/c/test_%.c $(BUILD)/plain/libchm.a $(HDRS)
	$(CC) $(CFLAGS_BASE) $< $(BUILD)/plain/libchm.a $(LIBS) -o $@

$(BUILD)/san/test_%: tests/c/test_%.c $(BUILD)/san/libchm.a $(HDRS)
	$(CC) $(CFLAGS_BASE) $(SAN_FLAGS) $< $(BUILD)/san/libchm.a $(LIBS) -o $@

c-build: $(BIN_plain) $(BIN_san) $(BIN_tsan)

# the fast tier: plain and ASan/UBSan builds of the fast C tests; the slow
# tier: their TSan builds, and every build of the slow C tests
c-tests: $(call c_bins_in,$(CTESTS_FAST),plain san)
	@CHM_CTEST_JOBS=$(JOBS) scripts/run-c-tests.sh $^

c-tests-slow: $(call c_bins_in,$(CTESTS_FAST),tsan) $(call c_bins,$(CTESTS_SLOW))
	@CHM_CTEST_JOBS=$(JOBS) scripts/run-c-tests.sh $^

# ---- Python tests (exit code 5, "no tests collected", counts as success)
# PYTEST_JOBS pytest-xdist workers; tests marked xdist_group("name") share one
# worker (--dist loadgroup), for what must not run beside itself.

PYTEST = $(VENV)/bin/python -m pytest -q
PYTEST_XDIST = -n $(PYTEST_JOBS) --dist loadgroup
PYTEST_OK5 = rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc
# The serving engines' tests import torch and the engines when collected
# (about 20 s of CPU), and every pytest-xdist worker collects every file it
# is given: the fast tier runs them in one process of their own, beside the
# workers that run the rest.
ENGINE_TESTS := $(sort $(wildcard $(foreach e,lmcache sglang vllm,tests/integration/test_integration_$(e)*.py)))

pytest: ext
	@$(MAKE) --no-print-directory -k -j2 -O pytest-workers pytest-engines

pytest-workers:
	@$(PYTEST) tests $(PYTEST_XDIST) -m "not slow" $(addprefix --ignore=,$(ENGINE_TESTS)); $(PYTEST_OK5)

pytest-engines:
	@$(PYTEST) $(ENGINE_TESTS) -m "not slow"; $(PYTEST_OK5)

# the slow tier runs in one process: its benchmarks judge timings, and its spin
# runs use every CPU themselves
pytest-slow: ext
	@$(PYTEST) tests -m slow; $(PYTEST_OK5)

# ---- lint: the tools' own settings are in pyproject.toml and .clang-format

## lint: ruff (lint + format), strict mypy, and clang-format on the C sources
lint: setup
	@rc=0; \
	$(MAKE) --no-print-directory lint-py || rc=1; \
	$(MAKE) --no-print-directory lint-c || rc=1; \
	exit $$rc

lint-py:
	@rc=0; \
	echo "ruff check ."; $(VENV)/bin/ruff check . || rc=1; \
	echo "ruff format --check ."; $(VENV)/bin/ruff format --check . || rc=1; \
	echo "mypy"; $(VENV)/bin/mypy || rc=1; \
	exit $$rc

lint-c:
	@if ! command -v clang-format >/dev/null 2>&1; then \
		echo "lint-c: clang-format is not installed (scripts/setup.sh installs it): C not checked"; \
	else \
		echo "clang-format --dry-run --Werror $(CFORMAT)"; \
		clang-format --dry-run --Werror $(CFORMAT); \
	fi

format:
	$(VENV)/bin/ruff format .
	clang-format -i $(CFORMAT)

clean:
	rm -rf build chm/_chm_cffi.c chm/_chm_cffi*.so chm/*.o csrc/*.o $(VENV)/.chm-ext

distclean: clean
	rm -rf $(VENV) *.egg-info .hypothesis .mypy_cache .ruff_cache
