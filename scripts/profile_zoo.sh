#!/usr/bin/env bash
# Regenerate the bundled CPU profiles search_spaces/profiles/<model>_cpu.json.
#
#   scripts/profile_zoo.sh              # gpt, vgg16 and mlp
#   scripts/profile_zoo.sh mlp          # only the named zoo models
#
# Each is measured on this machine's CPU with one thread, the default zoo
# arguments, sizes 1..32, 15 interleaved rounds (median, monotone fit, pooled
# identical layers), the runtime's own costs calibrated, and the link measured by a
# real two-process gloo ping-pong. Timings depend on the machine and on its
# load: profile on an otherwise idle machine, and re-run the search and the
# benches (make bench) after regenerating, since their results are tied to
# these files.
set -euo pipefail
cd "$(dirname "$0")/.."

UMSEARCH=umsearch
[[ -x .venv/bin/umsearch ]] && UMSEARCH=.venv/bin/umsearch

models=("$@")
[[ ${#models[@]} -eq 0 ]] && models=(gpt vgg16 mlp)

for model in "${models[@]}"; do
    case "$model" in
        gpt | vgg16 | mlp) ;;
        *) echo "error: unknown zoo model '$model'; choose from gpt vgg16 mlp" >&2; exit 1 ;;
    esac
    out="search_spaces/profiles/${model}_cpu.json"
    start=$SECONDS
    "$UMSEARCH" profile "$model" --sizes 1,2,4,8,16,32 --threads 1 --repeats 15 --calibrate --out "$out"
    echo "$model: $((SECONDS - start)) s -> $out"
done
