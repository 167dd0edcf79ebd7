#!/usr/bin/env bash
# Prepares a Debian/Ubuntu machine for chm: installs the system packages that
# are missing (and only those), creates .venv and installs chm into it
# (editable, with the test extras), then builds the C extension in place.
set -euo pipefail
cd "$(dirname "$0")/.."

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
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v spin >/dev/null 2>&1 || need+=(spin)
command -v clang-format >/dev/null 2>&1 || need+=(clang-format)
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
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
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

# Reinstall only when the package metadata changed.
key=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
stamp="$VENV/.chm-install"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$key" ] ||
	! "$VENV/bin/python" -m pip show -q chm >/dev/null 2>&1; then
	echo "chm: installing chm (editable) and its test tools into $VENV"
	pip=("$VENV/bin/python" -m pip install -qq --disable-pip-version-check)
	"${pip[@]}" --upgrade pip setuptools wheel cffi
	"${pip[@]}" -e '.[test]'
	echo "$key" >"$stamp"
	# the editable install just built the extension
	scripts/build-ext.sh --stamp-only
fi

scripts/build-ext.sh
