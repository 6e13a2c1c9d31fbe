"""Hypothesis strategies and small builders shared by the tests."""

from __future__ import annotations

from hypothesis import strategies as st

from umsearch.core.plan import Plan, StagePlan
from umsearch.core.profile import LayerProfile, Link, Profile


def uniform_profile(
    layers: int = 4,
    fwd: float = 1.0,
    bwd: float = 2.0,
    out_bytes: float = 0.0,
    stash: float = 10.0,
    params: float = 100.0,
    latency: float = 0.0,
    bandwidth: float = 1.0,
) -> Profile:
    """Every layer costs the same at every size."""
    lay = tuple(
        LayerProfile(name=f"l{i}", fwd_ms=(fwd, fwd), bwd_ms=(bwd, bwd), out_bytes=out_bytes,
                     stash_bytes=stash, param_bytes=params)
        for i in range(layers)
    )  # fmt: skip
    return Profile(model="uniform", device="none", dtype="fp32", microbatch_sizes=(1, 2),
                   input_bytes=out_bytes, layers=lay, link=Link(latency_ms=latency,
                   bandwidth_gb_per_s=bandwidth))  # fmt: skip


@st.composite
def profiles(draw: st.DrawFn, min_layers: int = 2, max_layers: int = 6) -> Profile:
    """Random valid profiles with sub-linear, linear and super-linear layers and a real link."""
    n = draw(st.integers(min_layers, max_layers))
    sizes = draw(st.sampled_from([(1, 2), (1, 2, 4), (1, 2, 4, 8), (1, 3, 8)]))
    pos = st.floats(0.0, 5.0, allow_nan=False)
    layers = []
    for i in range(n):
        base_f, base_b = draw(st.floats(0.01, 2.0)), draw(st.floats(0.01, 4.0))
        fwd = tuple(base_f * s ** draw(st.floats(0.3, 1.2)) + draw(pos) * 0.01 for s in sizes)
        bwd = tuple(base_b * s ** draw(st.floats(0.3, 1.2)) for s in sizes)
        layers.append(LayerProfile(name=f"l{i}", fwd_ms=tuple(sorted(fwd)), bwd_ms=tuple(sorted(bwd)),
                                   out_bytes=draw(st.floats(0, 1e6)), stash_bytes=draw(st.floats(0, 1e5)),
                                   param_bytes=draw(st.floats(0, 1e7))))  # fmt: skip
    link = Link(latency_ms=draw(st.floats(0, 0.5)), bandwidth_gb_per_s=draw(st.floats(0.1, 100)))
    return Profile(model="random", device="none", dtype="fp32", microbatch_sizes=sizes,
                   input_bytes=draw(st.floats(0, 1e5)), layers=tuple(layers), link=link)  # fmt: skip


@st.composite
def partitions(draw: st.DrawFn, batch: int, max_parts: int = 6) -> tuple[int, ...]:
    """A random composition of ``batch`` into at most ``max_parts`` positive parts."""
    k = draw(st.integers(1, min(batch, max_parts)))
    cuts = sorted(draw(st.sets(st.integers(1, batch - 1), min_size=k - 1, max_size=k - 1))) if k > 1 else []
    bounds = [0, *cuts, batch]
    return tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False))


@st.composite
def plans(draw: st.DrawFn, num_layers: int, max_batch: int = 12) -> Plan:
    """Random valid plans, deadlocking ones included (recompute lets backward differ)."""
    S = draw(st.integers(1, min(num_layers, 4)))
    inner = sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=S - 1, max_size=S - 1)))
    cuts = [0, *inner, num_layers]
    B = draw(st.integers(1, max_batch))
    stages = []
    for s in range(S):
        fwd = draw(partitions(B))
        rec = draw(st.booleans())
        bwd = draw(partitions(B)) if rec else fwd
        warm = draw(st.integers(1, len(fwd) + 1))
        stages.append(StagePlan(layers=(cuts[s], cuts[s + 1]), forward=fwd, backward=bwd,
                                warmup=warm, recompute=rec))  # fmt: skip
    return Plan(global_batch=B, stages=tuple(stages))
