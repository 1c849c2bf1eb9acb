#!/usr/bin/env bash
# SGLang for the tests marked `sglang` (tests/test_cache_sglang.py): `pip install sglang` in its
# own virtual environment `.venv-sglang`, with this project (extra `sglang`) and the test
# runner installed into it. Idempotent: a finished environment (marker file) only gets the
# project reinstalled. A fresh one takes 9-13 minutes on 2 cores and ~11 GB of disk (SGLang
# pulls its CUDA wheels; its radix cache, all the tests use, runs on the CPU).
#
# There is no cheaper complete environment on the registry: SGLang's radix cache imports
# torchvision (through its model configs), the only torchvision wheels need the CUDA build of
# torch (the CPU build 2.13.0+cpu cannot load their operators), and the CUDA torch needs the
# NVIDIA libraries (torch 2.14.1 + torchvision + the radix cache's imports, SGLang without its
# dependencies: 8 minutes, 6 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CANOPY_SGLANG_VENV:-.venv-sglang}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -f "$VENV/.canopy-sglang-ready" ] \
    && "$VENV/bin/python" -c "import sglang.srt.mem_cache.radix_cache" 2>/dev/null; then
  "$VENV/bin/pip" install -q --no-deps -e . && exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e ".[sglang]" pytest pytest-benchmark pytest-timeout hypothesis
"$VENV/bin/python" -c "import sglang.srt.mem_cache.radix_cache, sglang; print('sglang', sglang.__version__)"
touch "$VENV/.canopy-sglang-ready"
