"""``umsearch profile``: measure a model into a profile JSON, or check a stored one (``--check``)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import click
import torch
from rich import box
from rich.markup import escape
from rich.table import Table

from umsearch.cli.console import console, warn
from umsearch.cli.flags import rows, shared, take
from umsearch.cli.interrupts import StopSignals
from umsearch.cli.progress import Reporter
from umsearch.core.field_checks import MAX_INT
from umsearch.core.links import (
    MAX_BANDWIDTH_GB_PER_S,
    MAX_LATENCY_MS,
    MIN_BANDWIDTH_GB_PER_S,
    ONE_GPU_DEFAULT,
    PRESETS,
)
from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.core.options import float_in, int_at_least, option
from umsearch.core.profile import (
    PRECISIONS,
    Link,
    Profile,
    load_profile,
    profile_precision,
    save_profile,
)
from umsearch.errors import ProfilingError
from umsearch.measure.profiler import (
    CONTEXT_LAYERS,
    DEFAULT_REPEATS,
    DEFAULT_STOP_PRECISION_PCT,
    ProfileConfig,
    ProfileInterrupted,
    measured_context,
)
from umsearch.nn.precision import Precision, check_precision
from umsearch.storage.jsonio import write_json
from umsearch.storage.outputs import check_output_file

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
    huge = [s for s in sizes if s > MAX_INT]
    if huge:
        raise ProfilingError(f"--sizes {text!r} has size {huge[0]}, above the largest microbatch size {MAX_INT}; "
                             "give sizes like 1,2,4,8")  # fmt: skip
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


def _finite(value: float | None, flag: str, lo: float, hi: float, example: str, *, positive: bool = False) -> None:
    """Refuse a flag value that is not a finite number in ``[lo, hi]`` (``(lo, hi]`` when ``positive``)."""
    if value is None:
        return
    if not math.isfinite(value) or value < lo or (positive and value == lo) or value > hi:
        side = f"above {lo:g}" if positive else f"from {lo:g}"
        raise ProfilingError(f"{flag} {value!r} must be a finite number {side} to {hi:g}, e.g. {flag} {example}")


@dataclass(frozen=True, kw_only=True)
class LinkChoice:
    """The link as the flags give it: stated numbers, a preset, or to be measured (both None)."""

    latency_ms: float | None
    bandwidth_gb_per_s: float | None
    preset: str | None

    @property
    def stated(self) -> bool:
        return self.latency_ms is not None


def link_choice(latency: float | None, bandwidth: float | None, preset: str | None, device: torch.device) -> LinkChoice:
    """Check the link flags (before anything is measured): both numbers or neither, finite and in the
    profile loader's limits, or a preset; on one GPU without either, the default preset."""
    if (latency is None) != (bandwidth is None):
        raise ProfilingError("give both --link-latency-ms and --link-bandwidth-gbps, or neither to measure the link")
    _finite(latency, "--link-latency-ms", 0.0, MAX_LATENCY_MS, "0.01")  # the bounds every link read passes
    _finite(bandwidth, "--link-bandwidth-gbps", MIN_BANDWIDTH_GB_PER_S, MAX_BANDWIDTH_GB_PER_S, "100")
    if preset is not None:
        if latency is not None:
            raise ProfilingError(f"--link-preset {preset} and --link-latency-ms/--link-bandwidth-gbps both state the "
                                 "link; give one of them")  # fmt: skip
        chosen = PRESETS[preset]
        return LinkChoice(latency_ms=chosen.latency_ms, bandwidth_gb_per_s=chosen.bandwidth_gb_per_s, preset=preset)
    if latency is None and device.type == "cuda" and torch.cuda.device_count() < 2:
        chosen = PRESETS[ONE_GPU_DEFAULT]
        return LinkChoice(latency_ms=chosen.latency_ms, bandwidth_gb_per_s=chosen.bandwidth_gb_per_s,
                          preset=ONE_GPU_DEFAULT)  # fmt: skip
    return LinkChoice(latency_ms=latency, bandwidth_gb_per_s=bandwidth, preset=None)


def link_source(choice: LinkChoice, defaulted: bool) -> dict[str, Any]:
    """The profile's ``link_source`` record: how the link was obtained, in words and numbers."""
    if choice.preset is not None:
        preset = PRESETS[choice.preset]
        how = "stated: default preset, one GPU cannot measure a link" if defaulted else "stated: --link-preset"
        return {"measured": False, "how": how, **preset.to_json()}
    if choice.stated:
        return {"measured": False, "how": "stated: --link-latency-ms and --link-bandwidth-gbps",
                "latency_ms": choice.latency_ms, "bandwidth_gb_per_s": choice.bandwidth_gb_per_s}  # fmt: skip
    return {"measured": True, "how": "two processes, point to point (umsearch.measure.link)"}


def resolve_link(choice: LinkChoice, device: torch.device, defaulted: bool) -> Link:
    """The link: stated (said once on screen), or measured between two processes (NCCL on two GPUs)."""
    if choice.latency_ms is not None and choice.bandwidth_gb_per_s is not None:
        where = f"preset {choice.preset}" if choice.preset else "flags"
        why = (f" (one GPU cannot measure a link; give --link-preset {'|'.join(PRESETS)} or "
               "--link-latency-ms/--link-bandwidth-gbps for your interconnect)") if defaulted else ""  # fmt: skip
        console.print(f"link: stated, not measured: {choice.latency_ms:g} ms latency, {choice.bandwidth_gb_per_s:g} "
                      f"GB/s ({where}){why}")  # fmt: skip
        return Link(latency_ms=choice.latency_ms, bandwidth_gb_per_s=choice.bandwidth_gb_per_s)
    from umsearch.measure.link import measure_link

    with console.status("measuring the link (two processes, point to point)..."):
        latency, bandwidth, _ = measure_link("nccl" if device.type == "cuda" else "gloo")
    console.print(f"link: {latency:.3f} ms latency, {bandwidth:.2f} GB/s (measured)")
    return Link(latency_ms=latency, bandwidth_gb_per_s=bandwidth)


def _memory_cap(limit_gb: float | None, device: torch.device) -> float | None:
    """``--memory-limit-gb`` in bytes; on a GPU also the allocator's own limit (so the cap is real)."""
    if limit_gb is None:
        return None
    _finite(limit_gb, "--memory-limit-gb", 0.0, 1e6, "80", positive=True)
    cap = limit_gb * 1e9
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if cap > total:
            raise ProfilingError(f"--memory-limit-gb {limit_gb:g} is more than the GPU's {total / 1e9:.1f} GB; give "
                                 f"at most {total / 1e9:.0f}")  # fmt: skip
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
    return cap


def _device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfilingError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)


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
           no_pool: bool, out: str | None, progress: str) -> None:  # fmt: skip
    from umsearch.measure.check import check_profile, check_steps
    from umsearch.nn.models import build_model

    if out:
        check_output_file(out, "--out")
    stored = load_profile(path)
    spec = _spec(model, args, stored, path)
    built = build_model(spec)
    dev = _device(device or ("cuda" if stored.device.startswith("cuda") else "cpu"))
    precision = Precision(profile_precision(stored) or "fp32")  # re-measure as it was measured
    check_precision(precision, dev)
    config = ProfileConfig(sizes=stored.microbatch_sizes, device=dev, repeats=repeats or CHECK_REPEATS, pool=not no_pool,
                           precision=precision, context_layers=measured_context(stored))  # fmt: skip
    total = check_steps(stored, config)
    with Reporter(progress, "profile --check") as shown:
        report = check_profile(stored, built, config, tick=lambda what: shown.advance(what, total=total))
    report["profile"] = str(path)
    console.print(check_table(report))
    console.print(f"[bold {_COLOR[report['verdict']]}]check: {report['verdict']}[/] - {escape(report['message'])}")
    if out:
        console.print(f"wrote {escape(str(write_json(out, report)))}")


def _measure(built: Any, spec: ModelSpec, config: ProfileConfig, link: Link, progress: str) -> Profile:
    from umsearch.measure.profiler import profile_model

    with Reporter(progress, "profile") as shown:
        prof = profile_model(built, spec, config, link=link, tick=lambda what, total: shown.advance(what, total=total))
    note = prof.extra["measurement"]["memory"]["note"]
    if note:
        console.print(f"[yellow]{escape(note)}[/]")
    return prof


def _default_out(model: str) -> str:
    return f"{model.replace(':', '_').replace('.', '_').replace('/', '_')}_profile.json"


@dataclass(frozen=True, kw_only=True)
class ProfileFlags:
    """``profile``'s own flags (their values are checked by the command, with the way out)."""

    sizes: str | None = field(default=None, metadata=option(
        f"Microbatch sizes to measure, including 1.  [default: {DEFAULT_SIZES}]", kind="text"))
    device: str | None = field(default=None, metadata=option(
        "Where to measure.  [default: cpu]", kind="choice", choices=("cpu", "cuda")))
    dtype: str = field(default="fp32", metadata=option(
        "Training precision: fp32; tf32 (GPU: TF32 matmuls and convolutions); bf16 or fp16 autocast (fp16 with "
        "loss scaling). Runs of plans from this profile use the same.", kind="choice", choices=PRECISIONS))
    repeats: int | None = field(default=None, metadata=option(
        "Most timed rounds; each measures every layer at every size still running once (median and spread over "
        "rounds; a cell stops earlier once --stop-precision is reached).  "
        f"[default: {DEFAULT_REPEATS}; {CHECK_REPEATS} with --check]", kind="int"))
    no_pool: bool = field(default=False, metadata=option(
        "Measure every layer on its own, even structurally identical ones.", kind="switch"))
    context_layers: int = field(default=CONTEXT_LAYERS, metadata=option(
        "Layers each timing runs together, the timed one among its neighbours as a stage runs it (1: every layer "
        "alone, as profiles before 2026-12 were measured).", kind="int", bounds=(1, MAX_INT),
        parse=int_at_least(1, "--context-layers")))
    stop_precision: float = field(default=DEFAULT_STOP_PRECISION_PCT, metadata=option(
        "Stop repeating a layer group at a size once each of its medians is known to this many percent (90% "
        "interval), after at least 5 rounds; 0: always run --repeats rounds.", kind="float", bounds=(0.0, 100.0),
        parse=float_in("--stop-precision", 0.0, 100.0)))
    memory_limit_gb: float | None = field(default=None, metadata=option(
        "Use at most this much memory (GB) for the profile; on a GPU also the allocator's limit.  [default: the "
        "free memory]", kind="float"))
    link_preset: str | None = field(default=None, metadata=option(
        "State the link as a named interconnect (see docs/gpus.md, 'Link presets').  [default: measured; on one "
        f"GPU, {ONE_GPU_DEFAULT}]", kind="choice", choices=tuple(PRESETS)))
    link_latency_ms: float | None = field(default=None, metadata=option(
        "State the link latency instead of measuring it.", kind="float"))
    link_bandwidth_gbps: float | None = field(default=None, metadata=option(
        "State the link bandwidth (GB/s) instead of measuring it.", kind="float"))
    check: str | None = field(default=None, metadata=option(
        "Re-measure a sample of this stored profile's layers and sizes and report the drift.", kind="path"))
    calibrate_too: bool = field(default=False, metadata=option(
        "Then fit the runtime's per-action and per-message costs (as umsearch calibrate does).", kind="switch",
        flag="--calibrate"))
    out: str | None = field(default=None, metadata=option(
        "Output file (default MODEL_profile.json; with --check, where to write the drift report).", kind="path"))


@click.command("profile")
@click.argument("model", required=False)
@shared("model_args")
@take(rows(ProfileFlags, "sizes", "device", "dtype", "repeats"))
@shared("threads", defaults={"threads": None})
@take(rows(ProfileFlags, "no_pool", "context_layers", "stop_precision", "memory_limit_gb", "link_preset",
           "link_latency_ms", "link_bandwidth_gbps", "check", "calibrate_too", "out"))
@shared("progress")
def profile_command(model: str | None, model_args: tuple[str, ...], sizes: str | None, device: str | None, dtype: str,
                    repeats: int | None, threads: int | None, no_pool: bool, context_layers: int,
                    stop_precision: float, memory_limit_gb: float | None, link_preset: str | None,
                    link_latency_ms: float | None, link_bandwidth_gbps: float | None,
                    check: str | None, calibrate_too: bool, out: str | None, progress: str) -> None:  # fmt: skip
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
        _check(check, model, model_args, device, repeats, no_pool, out, progress)
        return
    if model is None:
        raise ProfilingError("name the model to profile (a zoo name: gpt, vgg16, mlp; or package.module:function), "
                             "or pass --check PROFILE")  # fmt: skip
    # Everything a user can get wrong is refused here, before anything is built or measured.
    spec = ModelSpec(source=model, args=dict(parse_arg(a) for a in model_args))
    path = check_output_file(out or _default_out(model), "--out")
    dev = _device(device or "cpu")
    precision = Precision(dtype)
    check_precision(precision, dev)
    if calibrate_too and (precision.name != "fp32" or dev.type != "cpu"):
        # The probes of umsearch calibrate run fp32 on CPU ranks: they would fit another machine's costs.
        raise ProfilingError(f"--calibrate runs its probe plans in fp32 on CPU ranks, not in {precision.name} on "
                             f"{dev.type}; drop --calibrate (or profile with --device cpu --dtype fp32 to calibrate)")  # fmt: skip
    choice = link_choice(link_latency_ms, link_bandwidth_gbps, link_preset, dev)
    defaulted = choice.preset is not None and link_preset is None
    cap = _memory_cap(memory_limit_gb, dev)
    torch.set_num_threads(threads or 1)
    from umsearch.nn.models import build_model

    built = build_model(spec)
    warn(*built.notes)
    config = ProfileConfig(sizes=size_list, device=dev, repeats=repeats or DEFAULT_REPEATS, pool=not no_pool,
                           precision=precision, memory_cap_bytes=cap, context_layers=context_layers,
                           stop_precision_pct=stop_precision)  # fmt: skip
    # Compute first, link last: a model that cannot be profiled wastes no link measurement.
    with StopSignals() as stops:
        try:
            prof = _measure(built, spec, config, Link(latency_ms=0.0, bandwidth_gb_per_s=1.0), progress)
        except ProfileInterrupted as stop:
            # Ctrl-C (or SIGTERM/SIGHUP) during the rounds: keep what was measured, marked partial; no link
            # measurement and no calibration (search refuses it without --allow-partial).
            part = stop.profile
            if choice.latency_ms is not None and choice.bandwidth_gb_per_s is not None:
                part = replace(part, link=Link(latency_ms=choice.latency_ms, bandwidth_gb_per_s=choice.bandwidth_gb_per_s),
                               extra={**part.extra, "link_source": link_source(choice, defaulted)})  # fmt: skip
            else:
                part = replace(part, extra={**part.extra, "link_source": {
                    "measured": False, "how": "not measured: the profile was interrupted (placeholder link)"}})  # fmt: skip
            save_profile(part, path)
            console.print(f"[yellow]interrupted: wrote a partial profile to {escape(str(path))} "
                          f"({escape(part.extra['partial']['reason'])}); umsearch search refuses it unless "
                          "--allow-partial[/]")  # fmt: skip
            sys.exit(stops.exit_code(True))
    prof = replace(prof, link=resolve_link(choice, dev, defaulted),
                   extra={**prof.extra, "link_source": link_source(choice, defaulted)})  # fmt: skip
    console.print(profile_table(prof, model))
    print_quality(prof)
    if calibrate_too:
        from umsearch.orchestrate.calibration import calibrate
        from umsearch.runtime.model_source import spec_factory

        console.print("calibrating the runtime's own costs (a few probe plans on 2 ranks)...")
        prof, report = calibrate(prof, spec_factory(spec, 0), threads=threads or 1)
        console.print(f"op overhead {report['op_overhead_ms']:.4f} ms, message overhead "
                      f"{report['message_overhead_ms']:.4f} ms; probe error {report['mape_percent_bare']:.1f}% "
                      f"-> {report['mape_percent']:.1f}%")  # fmt: skip
    save_profile(prof, path)
    console.print(f"wrote {escape(str(path))}")
