"""Hypothesis strategies and small builders shared by the tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from umsearch.core.actions import Action
from umsearch.core.cluster import LAYOUTS, Cluster
from umsearch.core.plan import Plan, Stage
from umsearch.core.profile import LayerProfile, Link, Profile, RuntimeCosts
from umsearch.core.samples import spans


def uniform_profile(
    layers: int = 4, fwd: float = 1.0, bwd: float = 2.0, out_bytes: float = 0.0, stash: float = 10.0,
    params: float = 100.0, latency: float = 0.0, bandwidth: float = 1.0, split: bool = True,
    op_overhead_ms: float = 0.0, message_overhead_ms: float = 0.0,
) -> Profile:  # fmt: skip
    """Every layer costs the same at every size; with ``split``, I and W are half a backward each."""
    half = (bwd / 2, bwd / 2)
    lay = tuple(
        LayerProfile(name=f"l{i}", fwd_ms=(fwd, fwd), bwd_ms=(bwd, bwd), out_bytes=out_bytes, stash_bytes=stash,
                     param_bytes=params, bwd_input_ms=half if split else None, bwd_weight_ms=half if split else None)
        for i in range(layers)
    )  # fmt: skip
    return Profile(model="uniform", device="none", dtype="fp32", microbatch_sizes=(1, 2), input_bytes=out_bytes,
                   layers=lay, link=Link(latency_ms=latency, bandwidth_gb_per_s=bandwidth),
                   runtime=RuntimeCosts(op_overhead_ms=op_overhead_ms, message_overhead_ms=message_overhead_ms))  # fmt: skip


@st.composite
def profiles(draw: st.DrawFn, min_layers: int = 2, max_layers: int = 6, split: bool | None = None,
             overheads: bool = True) -> Profile:  # fmt: skip
    """Random valid profiles: sub-linear, linear and super-linear layers, a real link, optional I/W
    split (always, never, or drawn when ``split`` is None) and optional runtime overheads."""
    n = draw(st.integers(min_layers, max_layers))
    sizes = draw(st.sampled_from([(1, 2), (1, 2, 4), (1, 2, 4, 8), (1, 3, 8)]))
    has_split = draw(st.booleans()) if split is None else split
    layers = []
    for i in range(n):
        base_f, base_b = draw(st.floats(0.01, 2.0)), draw(st.floats(0.01, 4.0))
        fwd = tuple(sorted(base_f * s ** draw(st.floats(0.3, 1.2)) for s in sizes))
        bwd = tuple(sorted(base_b * s ** draw(st.floats(0.3, 1.2)) for s in sizes))
        share = draw(st.floats(0.2, 0.8))
        layers.append(LayerProfile(
            name=f"l{i}", fwd_ms=fwd, bwd_ms=bwd, out_bytes=draw(st.floats(0, 1e6)),
            stash_bytes=draw(st.floats(0, 1e5)), param_bytes=draw(st.floats(0, 1e7)),
            bwd_input_ms=tuple(v * share for v in bwd) if has_split else None,
            bwd_weight_ms=tuple(v * (1.1 - share) for v in bwd) if has_split else None,
        ))  # fmt: skip
    link = Link(latency_ms=draw(st.floats(0, 0.5)), bandwidth_gb_per_s=draw(st.floats(0.1, 100)))
    runtime = RuntimeCosts()
    if overheads and draw(st.booleans()):
        runtime = RuntimeCosts(op_overhead_ms=draw(st.floats(0, 0.3)), message_overhead_ms=draw(st.floats(0, 0.2)),
                               **draw(v21_terms(n)))  # fmt: skip
    return Profile(model="random", device="none", dtype="fp32", microbatch_sizes=sizes,
                   input_bytes=draw(st.floats(0, 1e5)), layers=tuple(layers), link=link, runtime=runtime)  # fmt: skip


@st.composite
def v21_terms(draw: st.DrawFn, num_layers: int) -> dict[str, Any]:
    """docs/model.md (version 2.1)'s optional terms, each present or not: per-MiB message cost, a stage scale curve
    and measured ranges (some of which random plans will hit exactly)."""
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["message_overhead_ms_per_mib"] = draw(st.floats(0, 0.5))
    if draw(st.booleans()):
        ks = sorted(draw(st.sets(st.integers(1, num_layers + 2), min_size=1, max_size=3)))
        out["stage_scale"] = tuple((k, draw(st.floats(0.5, 2.0))) for k in ks)
    if draw(st.booleans()):
        spans = draw(st.sets(st.tuples(st.integers(0, num_layers - 1), st.integers(1, num_layers)).filter(
            lambda t: t[0] < t[1]), max_size=4))  # fmt: skip
        out["ranges"] = tuple((lo, hi, draw(st.floats(0.5, 2.0))) for lo, hi in sorted(spans))
    return out


@st.composite
def partitions(draw: st.DrawFn, batch: int, max_parts: int = 6) -> tuple[int, ...]:
    """A random composition of ``batch`` into at most ``max_parts`` positive parts."""
    k = draw(st.integers(1, min(batch, max_parts)))
    cuts = sorted(draw(st.sets(st.integers(1, batch - 1), min_size=k - 1, max_size=k - 1))) if k > 1 else []
    bounds = [0, *cuts, batch]
    return tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False))


@st.composite
def placements(draw: st.DrawFn, ranks: int, stages: int) -> tuple[int, ...]:
    """Rank of each stage, every rank used: one per rank, looped, V-shaped or arbitrary."""
    kinds = ["arbitrary"]
    if stages == ranks:
        kinds.append("one")
    if stages % ranks == 0:
        kinds.append("loop")
    if stages == 2 * ranks:
        kinds.append("vshape")
    kind = draw(st.sampled_from(kinds))
    if kind in ("one", "loop"):
        return tuple(j % ranks for j in range(stages))
    if kind == "vshape":
        return tuple(j if j < ranks else 2 * ranks - 1 - j for j in range(stages))
    rest = draw(st.lists(st.integers(0, ranks - 1), min_size=stages - ranks, max_size=stages - ranks))
    order = draw(st.permutations([*range(ranks), *rest]))
    return tuple(order)


def random_orders(stages: Sequence[Stage], ranks: int, split: Sequence[Sequence[bool]], rng: random.Random,
                  causal: bool) -> tuple[tuple[Action, ...], ...]:  # fmt: skip
    """Random valid action lists (docs/model.md section 3).

    ``causal``: the lists are a random global order that respects every input
    across stages too, projected onto the ranks, so the plan cannot deadlock;
    otherwise only each stage's own rules hold and deadlocks are likely.
    """
    S = len(stages)
    pending: set[Action] = set()
    needs: dict[Action, list[Action]] = {}
    for j, s in enumerate(stages):
        fwd_of_bwd = spans(s.forward, s.backward)
        grad = spans(stages[j + 1].backward, s.backward) if j + 1 < S else None
        prev = spans(stages[j - 1].forward, s.forward) if j > 0 else None
        for k in range(len(s.forward)):
            a = Action(j, "F", k)
            pending.add(a)
            needs[a] = [Action(j - 1, "F", i) for i in prev[k]] if causal and prev is not None else []
        for k in range(len(s.backward)):
            own = [Action(j, "F", f) for f in fwd_of_bwd[k]]
            if causal and grad is not None:
                own += [Action(j + 1, "I" if split[j + 1][i] else "B", i) for i in grad[k]]
            if split[j][k]:
                i_act, w_act = Action(j, "I", k), Action(j, "W", k)
                pending |= {i_act, w_act}
                needs[i_act], needs[w_act] = own, [i_act]
            else:
                b_act = Action(j, "B", k)
                pending.add(b_act)
                needs[b_act] = own
    done: set[Action] = set()
    order: list[Action] = []
    while pending:
        ready = sorted(a for a in pending if all(p in done for p in needs[a]))
        a = ready[rng.randrange(len(ready))]
        pending.remove(a)
        done.add(a)
        order.append(a)
    return tuple(tuple(a for a in order if stages[a.stage].rank == r) for r in range(ranks))


@st.composite
def plan_shapes(draw: st.DrawFn, num_layers: int, max_batch: int,
                max_ranks: int) -> tuple[int, int, tuple[int, ...], list[int], int]:  # fmt: skip
    """A random plan's frame: ranks R, stages S, each stage's rank, the layer cuts and the batch B."""
    R = draw(st.integers(1, min(max_ranks, num_layers)))
    S = draw(st.integers(R, min(num_layers, 3 * R)))
    placement = draw(placements(R, S))
    inner = sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    return R, S, placement, [0, *inner, num_layers], draw(st.integers(1, max_batch))


@st.composite
def plans(draw: st.DrawFn, num_layers: int, max_batch: int = 12, max_ranks: int = 4, split: bool = True,
          recompute: bool = True) -> Plan:  # fmt: skip
    """Random valid plan/2s: placements, unequal lists, recompute, I/W splits, any valid order
    (deadlocking ones included)."""
    R, S, placement, cuts, B = draw(plan_shapes(num_layers, max_batch, max_ranks))
    stages = []
    for j in range(S):
        fwd = draw(partitions(B))
        rec = recompute and draw(st.booleans())
        stages.append(Stage(layers=(cuts[j], cuts[j + 1]), rank=placement[j], forward=fwd,
                            backward=draw(partitions(B)) if rec else fwd, recompute=rec))  # fmt: skip
    cut = [[split and draw(st.booleans()) for _ in s.backward] for s in stages]
    rng = random.Random(draw(st.integers(0, 2**32)))
    orders = random_orders(stages, R, cut, rng, causal=draw(st.booleans()))
    return Plan(global_batch=B, ranks=R, stages=tuple(stages), actions=orders)


@st.composite
def links(draw: st.DrawFn) -> Link:
    """A random link: latency up to a millisecond, 0.05 to 500 GB/s."""
    return Link(latency_ms=draw(st.floats(0, 1.0)), bandwidth_gb_per_s=draw(st.floats(0.05, 500)))


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """Random two-tier clusters, from one device per node (every link inter) to nodes wider than a plan."""
    return Cluster(gpus_per_node=draw(st.integers(1, 6)), intra=draw(links()), inter=draw(links()))


@st.composite
def dp_plans(draw: st.DrawFn, num_layers: int, max_replicas: int = 4, max_batch: int = 8, max_ranks: int = 4) -> Plan:
    """Random plans of docs/model.md section 9: :func:`plans` run by 1 to ``max_replicas`` replicas, with
    or without a cluster, either layout, with or without zero1, gradient buckets of any cap or none
    (deadlocking ones included)."""
    import dataclasses

    base = draw(plans(num_layers, max_batch=max_batch, max_ranks=max_ranks))
    D = draw(st.integers(1, max_replicas))
    return dataclasses.replace(base, global_batch=base.global_batch * D, data_parallel=D,
                               cluster=draw(st.none() | clusters()), layout=draw(st.sampled_from(LAYOUTS)),
                               zero1=draw(st.booleans()),
                               bucket_mib=draw(st.none() | st.sampled_from([25.0]) | st.floats(1 / 64, 32)))  # fmt: skip
