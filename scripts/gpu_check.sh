#!/usr/bin/env bash
# The one GPU check (run on a lent CUDA machine; under 10 minutes): profiles gpt and vgg16 on CUDA at
# sizes 1..64, runs the tests that need CUDA, and writes everything under results/gpu/.
#
#   bash scripts/gpu_check.sh
#
# CI has no GPU: there the CUDA tests skip. Nothing here is needed to build or test the project.
set -uo pipefail
cd "$(dirname "$0")/.."
out=results/gpu
mkdir -p "$out"
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    # A CUDA machine comes without the project's venv: install what the check needs, CUDA torch kept.
    "$PY" -m pip install -q -e '.[dev]' > "$out/pip.log" 2>&1
fi
{
    "$PY" -c "import torch, json; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,
        'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"
} > "$out/environment.json"
status=0
for model in gpt vgg16; do
    start=$SECONDS
    timeout 240 "$PY" -m umsearch profile "$model" --device cuda --sizes 1,2,4,8,16,32,64 --repeats 7 \
        --out "$out/${model}_cuda.json" > "$out/${model}_profile.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && status=1
    echo "$model: $((SECONDS - start)) s, exit $rc" | tee -a "$out/summary.txt"
done
timeout 200 "$PY" -m pytest -q -k "cuda or gpu or nccl" tests > "$out/pytest.log" 2>&1 || status=1
tail -3 "$out/pytest.log" | tee -a "$out/summary.txt"
exit $status
