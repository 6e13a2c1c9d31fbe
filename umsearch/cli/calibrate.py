"""``umsearch calibrate``: fit the runtime's own costs (per action, per message, per MiB, stage scale) into a profile."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from umsearch.cli.console import console, write_output
from umsearch.cli.flags import rows, shared, take
from umsearch.cli.progress import Reporter
from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.core.options import int_in, option
from umsearch.core.profile import Profile, check_not_partial, load_profile, save_profile
from umsearch.errors import ModelSpecError, ProfilingError, RuntimeExecutionError
from umsearch.storage.outputs import check_output_file


def _spec(profile: Profile, path: str, model: str | None, args: tuple[str, ...], trust: bool) -> ModelSpec:
    """The model to run: ``--model`` (trusted), else the profile's ``model_spec`` under the trust rule."""
    if model is not None:
        return ModelSpec.from_json({"source": model, "args": dict(parse_arg(a) for a in args)}, "--model", trust=True)
    raw = profile.extra.get("model_spec")
    if raw is None:
        raise ProfilingError(f"{path} names no model (no 'model_spec'); name it with --model, e.g. --model gpt")
    spec = ModelSpec.from_json(raw, f"{path}: 'model_spec'", trust=trust)
    if not spec.trusted:
        raise ModelSpecError(f"{path} names the model {spec.source!r}, which is not a zoo model: building it would "
                             f"run that module's code; name it yourself (--model {spec.source}) or pass "
                             "--trust-model-code if you trust the file")  # fmt: skip
    return spec


def print_report(report: dict[str, Any]) -> None:
    """The fitted terms, every probe predicted bare, calibrated and held out, and the errors."""
    if report.get("judged") == "busy_ms":
        _print_replay_report(report)
        return
    scale = report["stage_scale"] or report["ranges"]
    console.print(f"op overhead [bold]{report['op_overhead_ms']:.4f} ms[/] per action, message overhead "
                  f"[bold]{report['message_overhead_ms']:.4f} ms[/] + "
                  f"[bold]{report['message_overhead_ms_per_mib']:.4f} ms/MiB[/] per cross-rank message; "
                  f"{report['scales']} {escape(json.dumps(scale)) if scale else '(none)'} "
                  f"(rms residual {report['rms_residual_ms']:.4f} ms over {report['actions']} actions and "
                  f"{report['range_rows']} profiled ranges)")  # fmt: skip
    _print_probes(report, "measured", "iteration-time error of the probes")


def _print_replay_report(report: dict[str, Any]) -> None:
    """:func:`print_report` of ``calibrate --replay``: the compute terms fitted, the message terms and links
    kept, every probe's busy time (all ranks summed) predicted bare, calibrated and held out."""
    scale = report["stage_scale"] or report["ranges"]
    console.print(f"op overhead [bold]{report['op_overhead_ms']:.4f} ms[/] per action; {report['scales']} "
                  f"{escape(json.dumps(scale)) if scale else '(none)'} (rms residual "
                  f"{report['rms_residual_ms']:.4f} ms over {report['actions']} replayed actions and "
                  f"{report['range_rows']} profiled ranges; every rank replayed alone on {escape(report['device'])})")  # fmt: skip
    console.print(f"kept from the profile, not fitted (a replayed rank posts and waits for no message): message "
                  f"overhead {report['message_overhead_ms']:.4f} ms + {report['message_overhead_ms_per_mib']:.4f} "
                  "ms/MiB per cross-rank message, and the links")  # fmt: skip
    _print_probes(report, "busy", "busy-time error of the replayed probes (every rank's actions summed)")


def _print_probes(report: dict[str, Any], measured: str, error: str) -> None:
    """One line per probe (its ``measured`` figure, predicted bare, calibrated and held out), then the
    ``error`` uncalibrated, in-sample and held out."""
    for r in report["probe_rows"]:
        held = r["predicted_held_out_ms"]
        console.print(f"  {escape(r['probe']):24s} {measured} {r['measured_ms']:8.2f} ms  predicted "
                      f"{r['predicted_bare_ms']:8.2f} -> {r['predicted_ms']:8.2f} ms"
                      + (f", held out {held:8.2f} ms" if held is not None else ""))  # fmt: skip
    held_out = report["held_out_mape_percent"]
    console.print(f"{error}: {report['mape_percent_bare']:.1f}% uncalibrated, {report['mape_percent']:.1f}% "
                  "in-sample, [bold]"
                  + (f"{held_out:.1f}%[/] held out (each probe predicted by a fit of the others)"
                     if held_out is not None else "no held-out error[/] (one probe only)"))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CalibrateFlags:
    """``calibrate``'s own flags."""

    rounds: int = field(default=7, metadata=option(
        "Measured rounds of each probe plan.", kind="int", bounds=(1, 1000), parse=int_in("--rounds", 1, 1000)))
    ranks: int = field(default=2, metadata=option(
        "Ranks of the probes.", kind="int", bounds=(2, 64), parse=int_in("--ranks", 2, 64)))
    batch: int = field(default=16, metadata=option(
        "Global batch of the probes.", kind="int", bounds=(2, 1 << 20), parse=int_in("--batch", 2, 1 << 20)))
    scales: str = field(default="stage_scale", metadata=option(
        "How layers run together in a stage are fitted: s(k) by layer count, one scale per measured range, or "
        "not at all.", kind="choice", choices=("stage_scale", "ranges", "none")))
    replay: bool = field(default=False, metadata=option(
        "Replay every probe rank alone on one device (umsearch replay) instead of running the ranks together: "
        "fits op overhead and the scales only, keeps the profile's message terms and links.", kind="switch"))
    device: str | None = field(default=None, metadata=option(
        "With --replay: where the ranks run [default: the profile's device type].", kind="text",
        metavar="cpu|cuda[:N]"))
    out: str | None = field(default=None, metadata=option(
        "Write the calibrated profile here (default: replace PROFILE.json, atomically).", kind="path"))


@click.command("calibrate")
@click.argument("profile_path", metavar="PROFILE.json", type=click.Path(dir_okay=False))
@shared("model", "model_args", "trust_model_code")
@take(rows(CalibrateFlags, "rounds", "ranks", "batch"))
@shared("threads")
@take(rows(CalibrateFlags, "scales", "replay", "device", "out"))
@shared("as_json", "progress")
def calibrate_command(profile_path: str, model: str | None, model_args: tuple[str, ...], trust_model_code: bool,
                      rounds: int, ranks: int, batch: int, threads: int, scales: str, replay: bool, device: str | None,
                      out: str | None, as_json: bool, progress: str) -> None:  # fmt: skip
    """Run a few probe plans for real and fit the runtime's own costs into PROFILE.json (docs/model.md 7)."""
    from umsearch.orchestrate.calibration import calibrate, require_this_machine
    from umsearch.runtime.model_source import spec_factory

    if device is not None and not replay:
        raise RuntimeExecutionError(f"--device {device} places replayed ranks; the probes of calibrate run as CPU "
                                    "processes: add --replay, or drop --device")  # fmt: skip
    target = profile_path if out is None else out
    check_output_file(target, "--out")  # before the probes run: a bad path is refused, a device never replaced
    profile = load_profile(profile_path)
    check_not_partial(profile, False, profile_path, flag=None)  # calibrated and tuned only when whole
    if model_args and model is None:
        raise ModelSpecError("--arg needs --model: it is an argument of the model you name")
    spec = _spec(profile, profile_path, model, model_args, trust_model_code)
    if replay:
        _calibrate_replay(profile, spec, target, device=device, rounds=rounds, ranks=ranks, batch=batch,
                          threads=threads, scales=scales, as_json=as_json, progress=progress)  # fmt: skip
        return
    require_this_machine(profile, "calibrate")  # as calibrate does, but before a progress line: one line if refused
    # One step: the probes run in one launch and report nothing until it ends (no per-round hook).
    with Reporter(progress, "calibrate", quiet=as_json) as shown:
        shown.update(0, 1, f"running the probe plans on {ranks} ranks, {rounds} round(s) each")
        calibrated, report = calibrate(profile, spec_factory(spec, 0), rounds=rounds, ranks=ranks, batch=batch,
                                       threads=threads, scales=scales)  # type: ignore[arg-type]  # fmt: skip
        shown.update(1, 1, f"ran {len(report['probe_rows'])} probe plans and fitted the runtime's costs")
    write_output(target, "--out", lambda p: save_profile(calibrated, p))
    if as_json:
        click.echo(json.dumps({**report, "profile": str(Path(target))}))
        return
    print_report(report)
    console.print("wrote " + escape(str(target)))


def _calibrate_replay(profile: Profile, spec: ModelSpec, target: str, *, device: str | None, rounds: int, ranks: int,
                      batch: int, threads: int, scales: str, as_json: bool, progress: str) -> None:  # fmt: skip
    """``calibrate --replay``: every probe rank replayed alone on ``device`` (default: the profile's device
    type), the compute terms fitted, the profile's message terms and links kept."""
    from umsearch.orchestrate.calibration import (
        calibrate_replay,
        gpu_count,
        probe_plans,
        require_this_machine,
    )
    from umsearch.runtime.model_source import spec_factory
    from umsearch.runtime.preflight import profile_device_type
    from umsearch.runtime.replay import parse_device

    kind = profile_device_type(profile) or "cpu"
    if device is None and kind == "cuda" and gpu_count() == 0:
        raise RuntimeExecutionError(f"the profile was measured on {profile.device} and calibrate --replay replays its "
                                    "ranks on that device type, but torch sees no GPU on this machine: run it where "
                                    "one GPU is visible (one is enough: the ranks run one at a time)")  # fmt: skip
    where = parse_device(device if device is not None else kind)
    require_this_machine(profile, "calibrate --replay", device_type=where.type)  # before a progress line
    total = len(probe_plans(profile, ranks, batch))
    with Reporter(progress, "calibrate", quiet=as_json) as shown:

        def on_probe(done: int, _total: int, name: str) -> None:
            shown.update(done, total, f"replaying every rank of {name} alone on {where}, {rounds} round(s) each")

        calibrated, report = calibrate_replay(profile, spec_factory(spec, 0), rounds=rounds, ranks=ranks, batch=batch,
                                              threads=threads, scales=scales, device=where,  # type: ignore[arg-type]
                                              on_probe=on_probe)  # fmt: skip
        shown.update(total, total, f"replayed {total} probe plans and fitted the compute terms")
    write_output(target, "--out", lambda p: save_profile(calibrated, p))
    if as_json:
        click.echo(json.dumps({**report, "profile": str(Path(target))}))
        return
    print_report(report)
    console.print("wrote " + escape(str(target)))
