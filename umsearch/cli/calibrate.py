"""``umsearch calibrate``: fit the runtime's own per-action and per-message costs into a profile."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from umsearch.cli.console import console, write_output
from umsearch.core.errors import ModelSpecError, ProfilingError
from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.core.profile import Profile, load_profile, save_profile


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


@click.command("calibrate")
@click.argument("profile_path", metavar="PROFILE.json", type=click.Path(dir_okay=False))
@click.option("--model", default=None, help="Model to run (default: the profile's model_spec).")
@click.option("--arg", "model_args", multiple=True, help="Model argument KEY=VALUE (with --model; repeatable).")
@click.option("--trust-model-code", is_flag=True, help="Build a non-zoo model the profile names.")
@click.option("--rounds", type=click.IntRange(1, 1000), default=7, show_default=True,
              help="Measured rounds of each probe plan.")  # fmt: skip
@click.option("--ranks", type=click.IntRange(2, 64), default=2, show_default=True, help="Ranks of the probes.")
@click.option("--batch", type=click.IntRange(2, 1 << 20), default=16, show_default=True,
              help="Global batch of the probes.")  # fmt: skip
@click.option("--threads", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="CPU threads per rank (as umsearch run uses).")  # fmt: skip
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Write the calibrated profile here (default: replace PROFILE.json, atomically).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the calibration report as JSON.")
def calibrate_command(profile_path: str, model: str | None, model_args: tuple[str, ...], trust_model_code: bool,
                      rounds: int, ranks: int, batch: int, threads: int, out: str | None, as_json: bool) -> None:  # fmt: skip
    """Run a few probe plans for real and fit the runtime's fixed costs into PROFILE.json (MODEL.md 7)."""
    from umsearch.orchestrate.calibration import calibrate
    from umsearch.runtime.factory import spec_factory

    profile = load_profile(profile_path)
    if model_args and model is None:
        raise ModelSpecError("--arg needs --model: it is an argument of the model you name")
    spec = _spec(profile, profile_path, model, model_args, trust_model_code)
    target = out or profile_path
    calibrated, report = calibrate(profile, spec_factory(spec, 0), rounds=rounds, ranks=ranks, batch=batch,
                                   threads=threads)  # fmt: skip
    write_output(target, "--out", lambda p: save_profile(calibrated, p))
    if as_json:
        click.echo(json.dumps({**report, "profile": str(Path(target))}))
        return
    console.print(f"op overhead [bold]{report['op_overhead_ms']:.4f} ms[/] per action, message overhead "
                  f"[bold]{report['message_overhead_ms']:.4f} ms[/] per cross-rank message "
                  f"(rms residual {report['rms_residual_ms']:.4f} ms over {report['actions']} actions)")  # fmt: skip
    for r in report["probe_rows"]:
        console.print(f"  {escape(r['probe']):24s} measured {r['measured_ms']:8.2f} ms  predicted "
                      f"{r['predicted_bare_ms']:8.2f} -> {r['predicted_ms']:8.2f} ms")  # fmt: skip
    console.print(f"iteration-time error of the probes: {report['mape_percent_bare']:.1f}% uncalibrated, "
                  f"{report['mape_percent']:.1f}% calibrated")  # fmt: skip
    console.print("wrote " + escape(str(target)))
