#!/usr/bin/env bash
# Rebuilds the C extensions in place (the cffi binding of the core, and
# chm._robuf) when the C sources, the header or the build scripts changed
# (also when a C file was added or removed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

key=$( (ls csrc/*.c csrc/*.h include/*.h; cat setup.py chm/_build_ffi.py chm/_robuf.c csrc/*.c csrc/*.h include/*.h) |
	sha256sum | cut -d' ' -f1)
stamp="$VENV/.chm-ext"
if [ "${1:-}" = "--stamp-only" ]; then
	# after `pip install -e .` built it: record it if it loads
	if "$VENV/bin/python" -c 'import chm._ffi, chm._robuf' >/dev/null 2>&1; then echo "$key" >"$stamp"; fi
	exit 0
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && ls chm/_chm_cffi*.so chm/_robuf*.so >/dev/null 2>&1; then
	exit 0
fi
echo "chm: building the C extension"
log=$(mktemp)
if ! "$VENV/bin/python" setup.py -q build_ext --inplace --force >"$log" 2>&1; then
	grep -E "error|chm:" "$log" | head -40 >&2 || true
	echo "chm: build failed (full log: $log)" >&2
	exit 1
fi
rm -f "$log"
# Undefined symbols only show at import time: check now, not in the tests.
if ! err=$("$VENV/bin/python" -c 'import chm._ffi, chm._robuf' 2>&1); then
	echo "chm: the built extension does not load: $(echo "$err" | tail -n 1)" >&2
	exit 1
fi
echo "$key" >"$stamp"
