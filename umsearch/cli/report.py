"""Write a search's outputs: plan, Pareto front, baselines, report and pictures.

Every file is first written into a staging folder inside the output folder;
only when all of them are there are they renamed into place, ``plan.json``
last (:class:`umsearch.storage.output_folder.OutputFolder`). Files the user keeps in the
folder are left alone: only what the previous search wrote there (its
manifest) is replaced or removed, and never an input the search read. So a
Ctrl-C, a full disk or a second search into the same ``--out`` never leaves a
half-written plan, and never costs the user a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from umsearch.core.cost import CostModel
from umsearch.core.plan_io import PlanDocument, save_document
from umsearch.core.profile import Profile, file_sha256
from umsearch.core.units import format_bytes
from umsearch.errors import OutputError
from umsearch.search.baselines import GREEDY
from umsearch.search.driver import SearchResult
from umsearch.search.scoring import Scored
from umsearch.search.space import SearchSpace
from umsearch.sim.reference import simulate
from umsearch.sim.result import SimResult
from umsearch.storage.jsonio import write_json, write_text_atomic
from umsearch.storage.output_folder import OutputFolder

PARETO_SCHEMA = "umsearch.pareto/1"
BASELINES_SCHEMA = "umsearch.baselines/2"
FILES = ("plan.json", "pareto.json", "baselines.json", "report.md", "pareto.png", "timeline.png", "trace.json")
"""What a search writes into its output folder."""


def baseline_file(name: str) -> str:
    """Where a search writes baseline ``name``'s plan, relative to its output folder."""
    return f"baselines/{name.replace(' ', '_')}.json"


def best_peer(result: SearchResult) -> Scored | None:
    """The fastest torch.distributed.pipelining baseline (the bar to clear)."""
    peers = [b for name, b in result.baselines.items() if b is not None and name != GREEDY]
    return min(peers, key=lambda b: b.iteration_ms, default=None)


def comparison_rows(result: SearchResult) -> list[dict[str, Any]]:
    """The plan and each baseline: time, speedup of the plan over it, memory, how it was found."""
    best = result.best
    rows = [{"name": "umsearch", "iteration_ms": best.iteration_ms, "speedup": 1.0,
             "peak_memory_bytes": best.max_memory, "method": best.method or "NSGA-II + local search"}]  # fmt: skip
    for name, b in result.baselines.items():
        rows.append({
            "name": name, "method": b.method if b else "no plan fits the memory limit (or needs the I/W split)",
            "iteration_ms": b.iteration_ms if b else None,
            "speedup": b.iteration_ms / best.iteration_ms if b else None,
            "peak_memory_bytes": b.max_memory if b else None,
        })  # fmt: skip
    return rows


def _cells(row: dict[str, Any]) -> list[str]:
    t = "-" if row["iteration_ms"] is None else f"{row['iteration_ms']:.3f}"
    sp = "-" if row["speedup"] is None else f"{row['speedup']:.3f}x"
    mem = "-" if row["peak_memory_bytes"] is None else format_bytes(row["peak_memory_bytes"])
    return [row["name"], t, sp, mem]


def comparison_table(result: SearchResult) -> Table:
    """Plan vs every baseline, one row each (how each was found goes to report.md)."""
    table = Table(title="plan vs baselines (same cost model)", title_justify="left")
    for col in ("plan", "iteration ms", "umsearch speedup", "peak memory"):
        table.add_column(col, justify="left" if col == "plan" else "right", no_wrap=True)
    for r in comparison_rows(result):
        table.add_row(*_cells(r))
    table.caption = f"{verdict(result)}; {bound_line(result)}"
    return table


def allreduce_overlap(sim: SimResult) -> tuple[float, float]:
    """(all-reduce time in all, the part of it hidden behind computation): each stage's all-reduce
    span against the times some rank computes (in the replica the simulation shows, the slowest);
    the rest is exposed. Both 0 with one replica."""
    busy: list[list[float]] = []
    for start, end in sorted((a.start_ms, a.end_ms) for a in sim.records):
        if busy and start <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], end)
        else:
            busy.append([start, end])
    total = hidden = 0.0
    for span in sim.allreduces:
        total += span.end_ms - span.start_ms
        hidden += sum(max(0.0, min(e, span.end_ms) - max(s, span.start_ms)) for s, e in busy)
    return total, hidden


def cluster_lines(result: SearchResult, space: SearchSpace, sim: SimResult) -> list[str]:
    """report.md's cluster section: the cluster, what the search chose, the all-reduce it hid, every
    factorization searched and every one pruned."""
    c, plan = space.cluster, result.best.plan
    if c is None:
        return []
    total, hidden = allreduce_overlap(sim)
    share = f" ({hidden / total:.0%})" if total > 0 else ""
    peer = best_peer(result)
    lines = ["", "## Cluster", "",
             f"{c.nodes} nodes x {c.gpus_per_node} GPUs = {c.devices} devices; intra-node link "
             f"{c.intra.latency_ms:g} ms, {c.intra.bandwidth_gb_per_s:g} GB/s; inter-node {c.inter.latency_ms:g} ms, "
             f"{c.inter.bandwidth_gb_per_s:g} GB/s.", "",
             f"Chosen: R = {plan.ranks} pipeline ranks x D = {plan.data_parallel} replicas, layout `{plan.layout}`, "
             f"ZeRO-1 {'on' if plan.zero1 else 'off'}. Gradient all-reduces take {total:.3f} ms in all, "
             f"{hidden:.3f} ms{share} of it hidden behind computation; computation ends at "
             f"{sim.compute_end_ms or 0.0:.3f} ms, the iteration at {sim.iteration_ms or 0.0:.3f} ms.",
             "", "Best torch schedule over every factorization and layout: "
             + (f"{peer.name} ({peer.method}), {peer.iteration_ms:.3f} ms." if peer else "none fits."),
             "", "| factorization | umsearch ms | best peer | peer ms | searched |", "|---|---:|---|---:|---|"]  # fmt: skip
    for o in result.factorizations:
        um = "-" if o.umsearch_ms == float("inf") else f"{o.umsearch_ms:.3f}"
        pn, pt = (o.peer.name, f"{o.peer.iteration_ms:.3f}") if o.peer else ("-", "-")
        lines.append(f"| {o.factorization.label} | {um} | {pn} | {pt} | "
                     f"{'NSGA-II + polish' if o.searched else 'screened'} |")  # fmt: skip
    lines += ["", "`+zero1`: memory binds there, so plans may shard optimizer states (kept only on a plan that "
              "does not fit without). Screened factorizations got the baselines and the first pass; the most "
              "promising got NSGA-II and the polish too.", ""]  # fmt: skip
    lines += [f"- pruned {p.factorization.label}: {p.reason}" for p in result.pruned]
    return lines


def verdict(result: SearchResult) -> str:
    """The plan against the fastest torch schedule that fits (every stage count, full checkpointing,
    ZeRO-1 and factorization the baselines cover): its speedup, or, where the search found nothing
    faster, that the plan handed over is that schedule."""
    peer = best_peer(result)
    if peer is None:
        return "no torch schedule fits the memory limit"
    if result.best.iteration_ms >= peer.iteration_ms or result.best.name == peer.name:
        return f"no plan faster than {peer.name} found: the plan is {peer.name}'s ({peer.iteration_ms:.3f} ms)"
    return f"{peer.iteration_ms / result.best.iteration_ms:.3f}x {peer.name}, the fastest torch schedule that fits"


def bound_line(result: SearchResult) -> str:
    """The memory-aware lower bound and the plan's gap to it."""
    gap = result.best.iteration_ms / result.lower_bound_ms - 1
    return (f"lower bound under the memory limit {result.lower_bound_ms:.3f} ms "
            f"(what must stay resident and be recomputed included); the plan is {gap:.1%} above it")


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def summary_line(result: SearchResult) -> str:
    """One line: the plan's time, its speedup over the best peer schedule, the gap to the bound."""
    return (f"plan {result.best.iteration_ms:.3f} ms, {verdict(result)}; "
            f"{result.best.iteration_ms / result.lower_bound_ms - 1:.1%} "
            f"above the memory-aware lower bound; {result.evaluations} plans scored in {result.wall_s:.1f} s")  # fmt: skip


def document(s: Scored, space: SearchSpace, profile: Profile, profile_path: Path, source: str) -> PlanDocument:
    """A plan file's contents: the plan, its prediction, and where it came from."""
    res = simulate(s.plan, CostModel(profile, state_factor=space.state_factor))
    meta: dict[str, Any] = {"profile": str(profile_path.resolve()), "profile_sha256": file_sha256(profile_path),
                            "state_factor": space.state_factor, "search_space": space.to_json(), "seed": space.search.seed,
                            "source": source}  # fmt: skip
    if "model_spec" in profile.extra:
        meta["model"] = profile.extra["model_spec"]
    return PlanDocument(plan=s.plan, predicted=res.predicted(), meta=meta)


def _report_md(result: SearchResult, space: SearchSpace, profile: Profile, profile_path: Path) -> str:
    rows = comparison_rows(result)
    sim = simulate(result.best.plan, CostModel(profile, state_factor=space.state_factor))
    plan = result.best.plan
    shape = f"R={plan.ranks}" if space.cluster is None else f"R={plan.ranks} x D={plan.data_parallel}"
    lines = [f"# umsearch plan: {space.name}", "",
             f"Profile `{profile_path}` ({profile.model}, {profile.device}); {shape}, "
             f"B={space.global_batch}, memory limit {format_bytes(space.memory_limit)}, seed {space.search.seed}.", "",
             "| plan | iteration ms | umsearch speedup | peak memory | how |", "|---|---:|---:|---:|---|"]  # fmt: skip
    lines += ["| " + " | ".join([*_cells(r), r["method"]]) + " |" for r in rows]
    lines += ["", f"Against torch: {verdict(result)}.", "", f"{_upper(bound_line(result))}.",
              f"Search: {result.generations} NSGA-II generations and local polish, {result.evaluations} plans scored "
              f"in {result.wall_s:.1f} s" + (" (interrupted)" if result.interrupted else "")
              + (" (stopped by the time budget)" if result.budget_hit else "") + ".", "",
              *cluster_lines(result, space, sim), "",
              "## Stages of the plan", "", "| stage | rank | layers | recompute | I/W | forward | backward |",
              "|---:|---:|---|---|---|---|---|"]  # fmt: skip
    for j, st in enumerate(plan.stages):
        names = f"[{st.lo}, {st.hi}) {profile.layers[st.lo].name}..{profile.layers[st.hi - 1].name}"
        back = "same" if st.backward == st.forward else " ".join(map(str, st.backward))
        lines.append(f"| {j} | {st.rank} | {names} | {st.recompute} | {plan.uses_split[j]} | "
                     f"{' '.join(map(str, st.forward))} | {back} |")  # fmt: skip
    lines += ["", "## Pareto front", "", "| # | iteration ms | peak memory |", "|---:|---:|---:|"]
    lines += [f"| {i} | {s.iteration_ms:.3f} | {format_bytes(s.max_memory)} |" for i, s in enumerate(result.pareto)]
    lines += ["", "`umsearch search ... --pick N` writes front point N as plan.json."]
    return "\n".join(lines) + "\n"


def _write_all(result: SearchResult, space: SearchSpace, profile: Profile, folder: Path, pick: int) -> None:
    from umsearch.cli.pictures import write_chrome_trace, write_gantt, write_pareto

    profile_path = Path(space.profile)
    chosen = result.pareto[pick]
    doc = document(chosen, space, profile, profile_path, f"umsearch search (Pareto point {pick})")
    save_document(doc, folder / "plan.json")
    write_json(folder / "pareto.json", {
        "schema": PARETO_SCHEMA,
        "plans": [{"index": i, "iteration_ms": s.iteration_ms, "peak_memory_bytes": list(s.peak_memory_bytes),
                   "plan": s.plan.to_json()} for i, s in enumerate(result.pareto)],
    })  # fmt: skip
    write_json(folder / "baselines.json", {
        "schema": BASELINES_SCHEMA, "lower_bound_ms": result.lower_bound_ms, "rows": comparison_rows(result),
        "baseline_plans": {k: (document(v, space, profile, profile_path, f"baseline {k}").to_json() if v else None)
                           for k, v in result.baselines.items()},
    })  # fmt: skip
    (folder / "baselines").mkdir()
    for name, b in result.baselines.items():
        if b is not None:  # each as a plan file of its own, for umsearch compare / run / export
            save_document(document(b, space, profile, profile_path, f"baseline {name}"), folder / baseline_file(name))
    write_text_atomic(folder / "report.md", _report_md(result, space, profile, profile_path))
    front = [(s.iteration_ms, s.max_memory) for s in result.pareto]
    marks = {k: (v.iteration_ms, v.max_memory) for k, v in result.baselines.items() if v is not None}
    write_pareto(front, marks, folder / "pareto.png", memory_limit=space.memory_limit, chosen=front[pick],
                 title=f"{space.name}: time vs memory")  # fmt: skip
    sim = simulate(chosen.plan, CostModel(profile, state_factor=space.state_factor))
    write_gantt(sim.records, chosen.plan.ranks, folder / "timeline.png", allreduces=sim.allreduces,
                title=f"{space.name}: predicted {sim.iteration_ms:.2f} ms")  # fmt: skip
    write_chrome_trace(sim.records, folder / "trace.json", source="predicted", allreduces=sim.allreduces)


def output_folder(out: str | Path, space: SearchSpace, space_path: str | None) -> OutputFolder:
    """The search's ``--out`` folder, checked before the search starts (see :class:`OutputFolder`).

    The space TOML and the profile are the search's inputs: never replaced or removed.
    """
    inputs = [Path(space.profile), *([Path(space_path)] if space_path else [])]
    expected = [*FILES, *(baseline_file(n) for n in (*space.schedule.peers, GREEDY))]
    return OutputFolder(out, "--out", command="search", inputs=inputs, expected=expected, last=("plan.json",))


def write_outputs(result: SearchResult, space: SearchSpace, profile: Profile, out: OutputFolder,
                  pick: int = 0) -> dict[str, Path]:  # fmt: skip
    """Write every output file into ``out`` (see the module docstring); returns name -> path.

    ``pick`` chooses the Pareto point written as ``plan.json`` (0: the fastest).
    """
    if not 0 <= pick < len(result.pareto):
        raise OutputError(f"--pick {pick}: the Pareto front has {len(result.pareto)} plans (0..{len(result.pareto) - 1})")
    out.write(lambda stage: _write_all(result, space, profile, stage, pick))
    folder = out.path
    paths = {name.split(".")[0] + ("_png" if name == "pareto.png" else ""): folder / name for name in FILES}
    return {**paths, "baseline_plans": folder / "baselines"}
