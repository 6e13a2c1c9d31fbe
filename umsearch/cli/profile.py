"""``umsearch profile``: measure a model into a profile JSON, or check a stored one (``--check``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import torch
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from umsearch.cli.console import console
from umsearch.core.errors import ProfilingError
from umsearch.core.jsonio import write_json
from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.core.profile import Link, Profile, load_profile, save_profile
from umsearch.measure.profiler import DEFAULT_REPEATS, ProfileConfig

DEFAULT_SIZES = "1,2,4,8,16,32"
CHECK_REPEATS = 7
"""Rounds of ``--check`` unless ``--repeats`` is given."""
_COLOR = {"good": "green", "ok": "green", "inconsistent": "yellow", "unjudged": "yellow", "noisy": "red",
          "drifted": "red"}  # fmt: skip


# ---------------------------------------------------------------------------------- flag checks
def parse_sizes(text: str) -> tuple[int, ...]:
    """``--sizes`` as ascending distinct sizes; refuses what the profile loader would refuse."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise ProfilingError(f"--sizes {text!r} must be comma-separated integers like 1,2,4,8") from None
    bad = [s for s in sizes if s < 1]
    if bad:
        raise ProfilingError(f"--sizes {text!r} has non-positive size {bad[0]}; microbatch sizes are at least 1")
    out = tuple(sorted(set(sizes)))
    if out[0] != 1:
        raise ProfilingError(f"--sizes {text!r} must include 1 (profiles start at size 1), e.g. 1,{text}")
    if len(out) < 2:
        raise ProfilingError(f"--sizes {text!r} needs at least two distinct sizes (above the largest, times "
                             "are extrapolated from the last two), e.g. 1,2,4,8")  # fmt: skip
    return out


def _positive(value: int | None, flag: str, example: int) -> None:
    if value is not None and value < 1:
        raise ProfilingError(f"{flag} {value} must be at least 1, e.g. {flag} {example}")


def _link(latency: float | None, bandwidth: float | None, device: str) -> Link:
    if (latency is None) != (bandwidth is None):
        raise ProfilingError("give both --link-latency-ms and --link-bandwidth-gbps, or neither to measure the link")
    if latency is not None and latency < 0:
        raise ProfilingError(f"--link-latency-ms {latency} is negative; a latency is 0 or more milliseconds")
    if bandwidth is not None and not bandwidth > 0:
        raise ProfilingError(f"--link-bandwidth-gbps {bandwidth} must be positive (GB/s), e.g. 10")
    if latency is None or bandwidth is None:
        from umsearch.measure.link import measure_link

        with console.status("measuring the link (two processes, point to point)..."):
            latency, bandwidth, _ = measure_link("nccl" if device == "cuda" else "gloo")
        console.print(f"link: {latency:.3f} ms latency, {bandwidth:.2f} GB/s (measured)")
    return Link(latency_ms=latency, bandwidth_gb_per_s=bandwidth)


def _device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfilingError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    return torch.device(device)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)  # fmt: skip


# ------------------------------------------------------------------------------------- reports
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def print_quality(prof: Profile) -> None:
    """The quality report: calibration ranges, pooled groups, spreads, and the verdict."""
    q = prof.extra["quality"]
    for c in prof.extra.get("calibration", []):
        color = "yellow" if abs(c["error"]) > q["calibration"]["limit"] else "dim"
        console.print(f"[{color}]calibration: layers {c['layers'][0]}..{c['layers'][1] - 1} at size {c['size']} took "
                      f"{c['measured_ms']:.3f} ms end to end, their layers sum to {c['sum_ms']:.3f} ms "
                      f"({c['error']:+.0%})[/]")  # fmt: skip
    names = [lay.name for lay in prof.layers]
    for g in q["pooled"]:
        console.print(f"pooled (identical, one estimate): {escape(', '.join(names[i] for i in g))}")
    share = q.get("cpu_share")
    if share is not None:
        console.print(f"profiler's share of a CPU per round (median): {share:.0%}")
    m = prof.extra.get("measurement", {})
    console.print(f"{q['rounds']} rounds, {m.get('in_flight', '?')} graphs in flight, {m.get('threads', '?')} thread(s), "
                  f"{m.get('duration_s', 0.0):.1f} s")  # fmt: skip
    console.print(f"[bold {_COLOR.get(q['verdict'], 'white')}]quality: {q['verdict']}[/] - {escape(q['message'])}")


def profile_table(prof: Profile, model: str) -> Table:
    """Per layer: times at the largest size, spreads, bytes, pooled group."""
    b = prof.microbatch_sizes[-1]
    rows = {r["layer"]: r for r in prof.extra["quality"]["layers"]}
    pooled = {i: n for n, g in enumerate(prof.extra["quality"]["pooled"]) for i in g}
    table = Table(title=f"profile of {escape(model)}: ms at size {b}, bytes per sample", box=box.SIMPLE_HEAD,
                  padding=(0, 0, 0, 1), pad_edge=False)  # fmt: skip
    table.add_column("layer", no_wrap=True)
    for col in ("pool", "F", "B", "I", "W", "IQR F/B", "out", "stash", "params"):
        table.add_column(col, justify="right", no_wrap=True)
    for i, lay in enumerate(prof.layers):
        spread = rows[i]["spread"]
        table.add_row(
            escape(lay.name), f"#{pooled[i]}" if i in pooled else "", f"{lay.fwd_ms[-1]:.3f}", f"{lay.bwd_ms[-1]:.3f}",
            f"{lay.bwd_input_ms[-1]:.3f}" if lay.bwd_input_ms else "-",
            f"{lay.bwd_weight_ms[-1]:.3f}" if lay.bwd_weight_ms else "-",
            f"{_pct(spread.get('fwd'))}/{_pct(spread.get('bwd'))}", _bytes(lay.out_bytes), _bytes(lay.stash_bytes),
            _bytes(lay.param_bytes),
        )  # fmt: skip
    return table


def _bytes(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def check_table(report: dict[str, Any]) -> Table:
    table = Table(title="drift against the stored profile (forward + backward)", box=box.SIMPLE_HEAD)
    for col in ("layers", "size", "stored ms", "measured ms", "spread ms", "drift"):
        table.add_column(col, justify="right")
    for c in report["cells"]:
        table.add_row(escape(c["name"]), str(c["size"]), f"{c['stored_ms']:.3f}", f"{c['measured_ms']:.3f}",
                      f"{c['spread_ms']:.3f}", f"{c['drift']:+.1%}")  # fmt: skip
    return table


# ------------------------------------------------------------------------------------ commands
def _spec(model: str | None, args: tuple[str, ...], stored: Profile | None, where: str) -> ModelSpec:
    if model is not None:
        return ModelSpec(source=model, args=dict(parse_arg(a) for a in args))
    assert stored is not None
    raw = stored.extra.get("model_spec")
    if raw is None:
        raise ProfilingError(f"{where} records no model_spec; name the model: umsearch profile MODEL --check {where}")
    spec = ModelSpec.from_json(raw, f"{where}: model_spec")
    if not spec.trusted:
        raise ProfilingError(f"{where} was measured from {spec.source!r}, which would import and run that module's "
                             f"code; name it yourself: umsearch profile {spec.source} --check {where}")  # fmt: skip
    return spec


def _check(path: str, model: str | None, args: tuple[str, ...], device: str | None, repeats: int | None,
           no_pool: bool, out: str | None) -> None:  # fmt: skip
    from umsearch.measure.check import check_profile, check_steps
    from umsearch.nn.models import build_model

    stored = load_profile(path)
    spec = _spec(model, args, stored, path)
    built = build_model(spec)
    dev = _device(device or ("cuda" if stored.device.startswith("cuda") else "cpu"))
    config = ProfileConfig(sizes=stored.microbatch_sizes, device=dev, repeats=repeats or CHECK_REPEATS, pool=not no_pool)
    with _progress() as bar:
        task = bar.add_task("checking", total=check_steps(stored, config))
        report = check_profile(stored, built, config, tick=lambda what: bar.update(task, advance=1, description=escape(what)))
    report["profile"] = str(path)
    console.print(check_table(report))
    console.print(f"[bold {_COLOR[report['verdict']]}]check: {report['verdict']}[/] - {escape(report['message'])}")
    if out:
        console.print(f"wrote {escape(str(write_json(out, report)))}")


def _measure(model: str, spec: ModelSpec, config: ProfileConfig, link: Link) -> Profile:
    from umsearch.nn.models import build_model
    from umsearch.measure.profiler import profile_model

    built = build_model(spec)
    with _progress() as bar:
        task = bar.add_task("profiling", total=None)
        prof = profile_model(built, spec, config, link=link,
                             tick=lambda what, total: bar.update(task, advance=1, total=total, description=escape(what)))  # fmt: skip
    if prof.microbatch_sizes != config.sizes:
        console.print(f"[yellow]sizes above {prof.microbatch_sizes[-1]} ran out of memory and were skipped[/]")
    return prof


@click.command("profile")
@click.argument("model", required=False)
@click.option("--arg", "args", multiple=True, help="Model argument KEY=VALUE (repeatable).")
@click.option("--sizes", default=None, help=f"Microbatch sizes to measure, including 1.  [default: {DEFAULT_SIZES}]")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Where to measure.  [default: cpu]")
@click.option("--repeats", type=int, default=None,
              help=f"Timed rounds; each measures every layer at every size once (median and spread over rounds).  "
                   f"[default: {DEFAULT_REPEATS}; {CHECK_REPEATS} with --check]")  # fmt: skip
@click.option("--threads", type=int, default=None, help="CPU intra-op threads (as in the runtime).  [default: 1]")
@click.option("--no-pool", is_flag=True, help="Measure every layer on its own, even structurally identical ones.")
@click.option("--link-latency-ms", type=float, default=None, help="State the link latency instead of measuring it.")
@click.option("--link-bandwidth-gbps", type=float, default=None, help="State the link bandwidth (GB/s) instead of measuring it.")
@click.option("--check", "check", type=click.Path(dir_okay=False), default=None,
              help="Re-measure a sample of this stored profile's layers and sizes and report the drift.")  # fmt: skip
@click.option("--calibrate", "calibrate_too", is_flag=True,
              help="Then fit the runtime's per-action and per-message costs (as umsearch calibrate does).")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Output file (default MODEL_profile.json; with --check, where to write the drift report).")  # fmt: skip
def profile_command(model: str | None, args: tuple[str, ...], sizes: str | None, device: str | None,
                    repeats: int | None, threads: int | None, no_pool: bool, link_latency_ms: float | None,
                    link_bandwidth_gbps: float | None, check: str | None, calibrate_too: bool,
                    out: str | None) -> None:  # fmt: skip
    """Measure MODEL (zoo name or package.module:function) layer by layer.

    With --check PROFILE, re-measure part of a stored profile instead (MODEL defaults to the one
    the profile names).
    """
    _positive(repeats, "--repeats", DEFAULT_REPEATS)
    _positive(threads, "--threads", 1)
    size_list = parse_sizes(sizes if sizes is not None else DEFAULT_SIZES)
    if check is not None:
        if threads is None:
            threads = int(load_profile(check).extra.get("measurement", {}).get("threads", 1))
        torch.set_num_threads(threads)
        _check(check, model, args, device, repeats, no_pool, out)
        return
    if model is None:
        raise ProfilingError("name the model to profile (a zoo name: gpt, vgg16, mlp; or package.module:function), "
                             "or pass --check PROFILE")  # fmt: skip
    dev = _device(device or "cpu")
    torch.set_num_threads(threads or 1)
    spec = ModelSpec(source=model, args=dict(parse_arg(a) for a in args))
    link = _link(link_latency_ms, link_bandwidth_gbps, dev.type)
    config = ProfileConfig(sizes=size_list, device=dev, repeats=repeats or DEFAULT_REPEATS, pool=not no_pool)
    prof = _measure(model, spec, config, link)
    console.print(profile_table(prof, model))
    print_quality(prof)
    if calibrate_too:
        from umsearch.orchestrate.calibration import calibrate
        from umsearch.runtime.factory import spec_factory

        console.print("calibrating the runtime's own costs (a few probe plans on 2 ranks)...")
        prof, report = calibrate(prof, spec_factory(spec, 0), threads=threads or 1)
        console.print(f"op overhead {report['op_overhead_ms']:.4f} ms, message overhead "
                      f"{report['message_overhead_ms']:.4f} ms; probe error {report['mape_percent_bare']:.1f}% "
                      f"-> {report['mape_percent']:.1f}%")  # fmt: skip
    path = Path(out or f"{model.replace(':', '_').replace('.', '_')}_profile.json")
    save_profile(prof, path)
    console.print(f"wrote {escape(str(path))}")
