"""docs/model.md section 5 against the replay's memory tally, rank by rank (issue 38).

Profiles each model on this CPU (fp32), builds plans of seven shapes on 2 to 4 ranks, replays every rank
alone for one iteration with the tally on (:func:`umsearch.runtime.replay.replay_rank`) and writes, per
model, plan and rank, the tallied peak of saved activations over section 5's prediction: version 2.3
(the profile as measured) and version 2.2 (the same profile without the 2.3 fields, which is exactly
what 2.2 predicted), and version 2.3 with each of its fields taken out alone; and whether the tallied
state is section 5's to the byte, with and without the tied weights counted once. Writes
``results/bench/memory_model.json``.

Run: ``python -m benchmarks.memory_model`` (``--quick``: mlp and gpt on 2 ranks).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.stats import environment
from umsearch.core.actions import Action
from umsearch.core.cost import CostModel
from umsearch.core.model_spec import ModelSpec
from umsearch.core.plan import Plan, Stage, equal_split, placed_plan
from umsearch.core.plan_rules import validate_plan
from umsearch.core.profile import LayerProfile, Link, Profile
from umsearch.core.schedules import PEER_SCHEDULES, warmup_rule
from umsearch.storage.jsonio import write_json

MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"layers": 8, "width": 256},
    "gpt": {"layers": 6, "width": 64, "heads": 4, "seq": 32, "vocab": 256},
    "vgg16": {"image": 32, "width": 4},
    "hybrid": {"stem": 2, "blocks": 4, "image": 16, "channels": 16, "width": 64, "heads": 4},
    "hf:gpt2": {"n_layer": 6, "n_embd": 32, "n_head": 4, "n_positions": 32, "vocab_size": 97, "seq": 12},
    "hf:llama": {"num_hidden_layers": 6, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "vocab_size": 97, "seq": 12},
}  # fmt: skip
"""Small sizes with at least 8 layers where the model allows (Interleaved1F1B and ZBV on 4 ranks need 8)."""
BATCH = 16
SIZES = (1, 2, 4, 8)
SCHEMA = "benchmarks.memory_model/1"


def peer(name: str, ranks: int, stages_per_rank: int, microbatches: int, layers: int) -> Plan:
    """torch's schedule ``name``: equal microbatches, layers split as evenly as possible."""
    p = PEER_SCHEDULES[name]
    S = ranks * stages_per_rank
    cuts = [round(j * layers / S) for j in range(S + 1)]
    return validate_plan(placed_plan(cuts, p.stage_ranks(ranks, stages_per_rank), BATCH,
                                     [equal_split(BATCH, microbatches)] * S,
                                     p.generate(ranks, stages_per_rank, microbatches)))  # fmt: skip


def warmup_plan(layers: int, forward: Sequence[Sequence[int]], recompute: bool) -> Plan:
    """One stage per rank, layers split evenly, ordered by the warmup rule with 1F1B's warmups."""
    R = len(forward)
    cuts = [round(j * layers / R) for j in range(R + 1)]
    stages = tuple(Stage(layers=(cuts[j], cuts[j + 1]), rank=j, forward=tuple(f), backward=tuple(f),
                         recompute=recompute) for j, f in enumerate(forward))  # fmt: skip
    actions = tuple(warmup_rule(j, st.forward, st.backward, R - j) for j, st in enumerate(stages))
    return validate_plan(Plan(global_batch=BATCH, ranks=R, stages=stages, actions=actions))


def deferred_w_plan(layers: int, ranks: int) -> Plan:
    """1F1B with every backward split, each rank's ``W`` all deferred to its end (zero-bubble style):
    what ``I`` frees is what keeps the peak down."""
    plan = warmup_plan(layers, [[2] * 8] * ranks, False)
    actions = tuple(tuple(Action(a.stage, "I", a.mb) if a.is_backward else a for a in acts)
                    + tuple(Action(a.stage, "W", a.mb) for a in acts if a.is_backward) for acts in plan.actions)  # fmt: skip
    return validate_plan(dataclasses.replace(plan, actions=actions))


UNEQUAL = ([2, 6, 8], [4, 4, 8], [8, 8], [4, 12])
"""Per stage, the unequal forward lists (every one sums to BATCH)."""


def plans(layers: int, ranks: int) -> dict[str, Plan]:
    """Seven plan shapes on ``ranks`` ranks; the two looped ones only where every stage gets a layer."""
    out = {"1F1B": peer("1F1B", ranks, 1, 8, layers), "GPipe": peer("GPipe", ranks, 1, 8, layers),
           "recompute": warmup_plan(layers, [[4] * 4] * ranks, True),
           "unequal": warmup_plan(layers, UNEQUAL[:ranks], False),
           "deferredW": deferred_w_plan(layers, ranks)}  # fmt: skip
    if layers >= 2 * ranks:
        out["Interleaved1F1B"] = peer("Interleaved1F1B", ranks, 2, 8, layers)
        out["ZBV"] = peer("ZBVZeroBubble", ranks, 2, 8, layers)
    return out


FIELDS = {"boundary_shared_bytes": 0.0, "input_saved_bytes": None, "weight_stash_bytes": None}
"""Version 2.3's per-layer memory fields, each with the value that leaves it out."""
TERMS = (*FIELDS, "stash_fixed_bytes", "tied_weights")
"""Every version 2.3 memory term :func:`without` can take out."""


def spread_fixed(layer: LayerProfile, largest: int) -> LayerProfile:
    """The layer as the profiler measured it before ``stash_fixed_bytes``: its saves at the largest size per
    sample, the fixed part spread over the samples (in ``weight_stash_bytes`` too, which ``W`` holds)."""
    per = layer.stash_fixed_bytes / largest
    weight = None if layer.weight_stash_bytes is None else layer.weight_stash_bytes + per
    return dataclasses.replace(layer, stash_bytes=layer.stash_bytes + per, weight_stash_bytes=weight,
                               stash_fixed_bytes=0.0)  # fmt: skip


def without(profile: Profile, *terms: str) -> Profile:
    """The profile with ``terms`` of :data:`TERMS` (default: all, i.e. as version 2.2 read it) left out."""
    terms = terms or TERMS
    layers = profile.layers
    if "stash_fixed_bytes" in terms:
        layers = tuple(spread_fixed(x, profile.microbatch_sizes[-1]) for x in layers)
    drop: dict[str, Any] = {k: FIELDS[k] for k in terms if k in FIELDS}
    tied = () if "tied_weights" in terms else profile.tied_weights
    return dataclasses.replace(profile, layers=tuple(dataclasses.replace(x, **drop) for x in layers), tied_weights=tied)


def section5(plan: Plan, cost: CostModel) -> list[tuple[float, float]]:
    """Per rank, docs/model.md 5's (state, peak activations): the reference simulator's peak less the state."""
    from umsearch.sim.reference import rank_peak_memory, rank_state_bytes

    states = [rank_state_bytes(plan, cost, r) for r in range(plan.ranks)]
    return [(float(s), float(rank_peak_memory(plan, cost, r) - s)) for r, s in enumerate(states)]


def measure(name: str, args: dict[str, Any], ranks: Sequence[int]) -> dict[str, Any]:
    """Profile ``name`` and compare every rank of every plan shape with the tally."""
    from umsearch.measure.profiler import ProfileConfig, profile_model
    from umsearch.nn.models import build_model
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.replay import replay_rank

    spec = ModelSpec(source=name, args=args)
    cfg = ProfileConfig(sizes=SIZES, repeats=2, min_repeats=1, warmup_rounds=0, calibration_rounds=1)
    profile = profile_model(build_model(spec), spec, cfg, link=Link(latency_ms=0.01, bandwidth_gb_per_s=10.0))
    new, old = CostModel(profile, state_factor=2.0), CostModel(without(profile), state_factor=2.0)
    less = {k: CostModel(without(profile, k), state_factor=2.0) for k in TERMS}  # one 2.3 term taken out
    rows = []
    for R in ranks:
        for shape, plan in plans(profile.num_layers, R).items():
            p_new, p_old = section5(plan, new), section5(plan, old)
            p_less = {k: section5(plan, c) for k, c in less.items()}
            for r in range(R):
                tally = replay_rank(plan, spec_factory(spec), r, steps=1).tally
                got = tally.saved_peak_bytes
                held = plan.stages_of(r)
                rows.append({"ranks": R, "plan": shape, "rank": r, "stages": list(held),
                             "first_and_last": 0 in held and plan.num_stages - 1 in held,
                             "tallied_activation_bytes": got,
                             "predicted_v23_bytes": p_new[r][1], "predicted_v22_bytes": p_old[r][1],
                             "ratio_v23": got / p_new[r][1], "ratio_v22": got / p_old[r][1],
                             "ratio_without": {k: got / p[r][1] for k, p in p_less.items()},
                             "tallied_state_bytes": tally.state_bytes, "predicted_state_bytes": p_new[r][0],
                             "state_exact": tally.state_bytes == p_new[r][0],
                             "state_exact_without_ties": tally.state_bytes == p_less["tied_weights"][r][0]})  # fmt: skip
                print(f"{name:9s} R={R} {shape:16s} r{r}: v2.3 {rows[-1]['ratio_v23']:.4f}  "
                      f"v2.2 {rows[-1]['ratio_v22']:.4f}", flush=True)  # fmt: skip
    layers = [{k: v for k, v in x.to_json().items() if not k.endswith("_ms")} for x in profile.layers]
    return {"model": name, "args": args, "layers": layers,
            "tied_weights": [t.to_json() for t in profile.tied_weights], "rows": rows}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="mlp and gpt on 2 ranks only")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of the models")
    ap.add_argument("--out", default="results/bench/memory_model.json")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    names = ["mlp", "gpt"] if a.quick else a.models.split(",")
    ranks = (2,) if a.quick else (2, 3, 4)
    t0 = time.time()
    models = [measure(n, MODELS[n], ranks) for n in names]
    ratios = [row["ratio_v23"] for m in models for row in m["rows"]]
    out = {"schema": SCHEMA, "environment": environment(), "batch": BATCH, "sizes": list(SIZES),
           "optimizer": "sgd (state factor 2)", "models": models, "seconds": time.time() - t0,
           "worst_v23": max(abs(x - 1) for x in ratios),
           "v22_within_2_percent": sum(abs(row["ratio_v22"] - 1) <= 0.02 for m in models for row in m["rows"]),
           "within_2_percent": sum(abs(x - 1) <= 0.02 for x in ratios), "ranks_compared": len(ratios),
           "state_exact": sum(row["state_exact"] for m in models for row in m["rows"])}  # fmt: skip
    write_json(Path(a.out), out)
    print(f"{out['within_2_percent']}/{len(ratios)} ranks within 2%, worst {out['worst_v23']:.4f}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
