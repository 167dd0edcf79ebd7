#!/usr/bin/env bash
# Prepares a Debian/Ubuntu machine for chm: installs the system packages that
# are missing (and only those), creates .venv and installs chm into it
# (editable), then builds the C extension in place.
#
#   scripts/setup.sh runtime   what `make demo` needs: a C compiler, liburing,
#                              libnuma, Python headers and venv; chm with its
#                              runtime dependencies (cffi, numpy, click, rich)
#   scripts/setup.sh test      (default) also what `make test` needs: fio,
#                              spin, clang-format; chm's test extras (pytest,
#                              pytest-xdist, hypothesis, mypy, ruff, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt-get-wait.sh
. scripts/apt-get-wait.sh

LEVEL=${1:-test}
case "$LEVEL" in
runtime | test) ;;
*)
	echo "usage: scripts/setup.sh [runtime|test] (got '$LEVEL')" >&2
	exit 2
	;;
esac
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

need=()
if command -v dpkg-query >/dev/null 2>&1; then
	for pkg in liburing-dev libnuma-dev; do
		have_pkg "$pkg" || need+=("$pkg")
	done
else
	for hdr in liburing.h:liburing-dev numaif.h:libnuma-dev; do
		echo "#include <${hdr%%:*}>" | cc -E -x c - -o /dev/null 2>/dev/null || need+=("${hdr##*:}")
	done
fi
command -v gcc >/dev/null 2>&1 || need+=(gcc)
if [ "$LEVEL" = test ]; then
	command -v fio >/dev/null 2>&1 || need+=(fio)
	command -v spin >/dev/null 2>&1 || need+=(spin)
	command -v clang-format >/dev/null 2>&1 || need+=(clang-format)
	command -v redis-server >/dev/null 2>&1 || need+=(redis-server) # the Master on Redis tests
fi
if ! command -v "$PY" >/dev/null 2>&1; then
	need+=(python3 python3-venv python3-dev)
else
	"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
	"$PY" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
		>/dev/null 2>&1 || need+=(python3-dev)
fi

if ((${#need[@]})); then
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "chm: missing ${need[*]}: install them with your package manager" >&2
		exit 1
	fi
	SUDO=
	if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
	echo "chm: installing ${need[*]}"
	apt_get update -qq
	DEBIAN_FRONTEND=noninteractive apt_get install -y -qq --no-install-recommends "${need[@]}"
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
	if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
		echo "chm: $VENV exists and is not a virtual environment" >&2
		exit 1
	fi
	echo "chm: creating $VENV"
	rm -rf "$VENV"
	"$PY" -m venv "$VENV"
fi

# Reinstall only when the package metadata changed, or when the test extras
# are wanted and only the runtime is there. The stamp holds "<key> <level>".
key=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
stamp="$VENV/.chm-install"
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" = "$key test" ] || { [ "$LEVEL" = runtime ] && [ "$have" = "$key runtime" ]; }; then
	"$VENV/bin/python" -m pip show -q chm >/dev/null 2>&1 || have=
else
	have=
fi
if [ -z "$have" ]; then
	spec=.
	what="chm (editable)"
	if [ "$LEVEL" = test ]; then
		spec='.[test]'
		what="chm (editable) and its test tools"
	fi
	echo "chm: installing $what into $VENV"
	pip=("$VENV/bin/python" -m pip install -qq --disable-pip-version-check)
	# The build needs these; with them in the venv the install builds in
	# place instead of in a second, throw-away environment.
	"${pip[@]}" 'setuptools>=77' wheel 'cffi>=1.15'
	"${pip[@]}" --no-build-isolation -e "$spec"
	echo "$key $LEVEL" >"$stamp"
	# the editable install just built the extension
	scripts/build-ext.sh --stamp-only
fi

scripts/build-ext.sh
