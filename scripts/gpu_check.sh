#!/usr/bin/env bash
# The one GPU check (issue 29), for a lent CUDA machine with one GPU of 80 GB or more, in under 8 minutes:
# python -m benchmarks.gpu_check runs the CUDA tests, a bf16 profile of the 24-block GPT (width 1024,
# sequence 1024), a 2 x 8 cluster plan of it, `umsearch replay --all-ranks` on the GPU (busy time and memory
# per rank against the prediction), `umsearch calibrate --replay` and a 1-rank `umsearch run --backend nccl`
# with its memory report; one line per check, results/bench/gpu.json with every figure. Exit 1 when any
# check failed.
#
#   bash scripts/gpu_check.sh
#
# CI has no GPU: there the CUDA tests skip, and tests/benchmarks/test_gpu_check.py rehearses the same steps
# on the CPU (python -m benchmarks.gpu_check --cpu). Nothing here is needed to build or test the project.
set -uo pipefail
cd "$(dirname "$0")/.."
out=results/bench
mkdir -p "$out"
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    # A CUDA machine comes without the project's venv: install what the check needs, CUDA torch kept.
    "$PY" -m pip install -q -e '.[dev]' > "$out/gpu_install.log" 2>&1
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU visible to torch: nothing to check"
    exit 1
fi
exec timeout 480 "$PY" -m benchmarks.gpu_check --out "$out"
