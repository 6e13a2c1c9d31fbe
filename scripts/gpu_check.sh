#!/usr/bin/env bash
# The one GPU check, for a lent CUDA machine with one GPU or more (under 5 minutes on one H200):
#   1. profiles gpt and vgg16 (zoo defaults) on CUDA in fp32 and bf16;
#   2. profiles a 24-block width-1024 GPT in TF32 at sizes 1..32 (the model of
#      search_spaces/profiles/gpt24w1024_h200_tf32.json, to compare with it);
#   3. profiles the 1.75B GPT (32 blocks, width 2048, sequence 2048) in TF32 at sizes 1..16 under an 80 GB
#      limit (--memory-limit-gb 80: the allocator's own limit too): the memory-bounded profiler must reach 16;
#   4. runs the tests that need CUDA;
#   5. searches a 1-rank plan on the bf16 gpt profile and runs `umsearch validate` on CUDA (predicted vs
#      measured on the GPU).
# Each step checks its own result (precision recorded, sizes reached, link stated on one GPU) and the script
# exits 1 when any step failed. It writes 8 files into results/gpu/: environment.json, log.txt (every
# command's output, the validate JSON and the summary) and six profiles.
#
#   bash scripts/gpu_check.sh
#
# CI has no GPU: there the CUDA tests skip. Nothing here is needed to build or test the project.
set -uo pipefail
cd "$(dirname "$0")/.."
out=results/gpu
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.txt "$out"/*.log
log="$out/log.txt"
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    # A CUDA machine comes without the project's venv: install what the check needs, CUDA torch kept.
    "$PY" -m pip install -q -e '.[dev]' >> "$log" 2>&1
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU visible to torch: nothing to check" | tee -a "$log"
    exit 1
fi
"$PY" - > "$out/environment.json" <<'EOF'
import json, subprocess, torch
def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - the record says what failed
        return f"unavailable: {exc}"
print(json.dumps({
    "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    "memory_gb": [torch.cuda.get_device_properties(i).total_memory / 1e9 for i in range(torch.cuda.device_count())],
    "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
    "commit": sh(["git", "rev-parse", "HEAD"]), "dirty": bool(sh(["git", "status", "--porcelain"])),
}, indent=2))
EOF
status=0
summary=()

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log everything, note the outcome
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "=== $name: $*" >> "$log"
    timeout "$limit" "$@" >> "$log" 2>&1
    local rc=$?
    [[ $rc -ne 0 ]] && status=1
    summary+=("$name: exit $rc, $((SECONDS - start)) s")
    return $rc
}

check() {  # check NAME PROFILE PRECISION SIZES: the profile says what was asked (and on one GPU a stated link)
    local name=$1
    if "$PY" - "$2" "$3" "$4" >> "$log" 2>&1 <<'EOF'
import sys, torch
from umsearch.core.profile import load_profile, profile_precision
path, precision, sizes = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
prof = load_profile(path)
assert profile_precision(prof) == precision, (profile_precision(prof), precision)
assert list(prof.microbatch_sizes) == sizes, (prof.microbatch_sizes, sizes, prof.extra["measurement"]["memory"])
assert prof.device.startswith("cuda: "), prof.device
assert prof.extra["measurement"]["timing"].startswith("CUDA events")
assert prof.extra["link_source"]["measured"] == (torch.cuda.device_count() >= 2), prof.extra["link_source"]
print(f"check ok: {path}: {prof.extra['quality']['verdict']}, in flight {prof.extra['measurement']['in_flight']}")
EOF
    then summary+=("$name: check ok"); else summary+=("$name: CHECK FAILED (see log.txt)"); status=1; fi
}

small=1,2,4,8,16,32
for model in gpt vgg16; do
    for dtype in fp32 bf16; do
        f="$out/${model}_${dtype}.json"
        step "$model $dtype" 22 "$PY" -m umsearch profile "$model" --device cuda --dtype "$dtype" --sizes $small \
            --repeats 5 --out "$f" && check "$model $dtype" "$f" "$dtype" "$small"
    done
done
gpt24=(--arg layers=24 --arg width=1024 --arg heads=16 --arg seq=1024 --arg vocab=32000)
f="$out/gpt24w1024_tf32.json"
step "gpt24 tf32" 50 "$PY" -m umsearch profile gpt "${gpt24[@]}" --device cuda --dtype tf32 --sizes $small \
    --repeats 5 --out "$f" && check "gpt24 tf32" "$f" tf32 "$small"
big=(--arg layers=32 --arg width=2048 --arg heads=16 --arg seq=2048 --arg vocab=32000)
f="$out/gpt32w2048_tf32_80gb.json"
step "gpt 1.75B tf32 80GB" 80 "$PY" -m umsearch profile gpt "${big[@]}" --device cuda --dtype tf32 \
    --sizes 1,2,4,8,16 --repeats 3 --memory-limit-gb 80 --out "$f" && check "gpt 1.75B" "$f" tf32 1,2,4,8,16
step "CUDA tests" 30 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or nccl or gpu" tests/measure tests/runtime
tmp=$(mktemp -d)
if step "search 1 rank" 15 "$PY" -m umsearch search --profile "$out/gpt_bf16.json" --ranks 1 --global-batch 16 \
        --time-budget-s 10 --out "$tmp/plan1" --quiet; then
    # The plan's profile is bf16 on cuda: validate runs it in bf16 on the GPU without being told.
    step "validate on CUDA" 15 "$PY" -m umsearch validate "$tmp/plan1/plan.json" --backend nccl --rounds 5 --json
fi
rm -rf "$tmp"
{
    echo "=== summary"
    printf '%s\n' "${summary[@]}"
    echo "files: $(ls "$out" | wc -l) in $out; exit $status"
} | tee -a "$log"
exit $status
