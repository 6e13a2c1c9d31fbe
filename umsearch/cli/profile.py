"""``umsearch profile``: measure a model into a profile JSON."""

from __future__ import annotations

from pathlib import Path

import click
import torch
from rich.progress import Progress
from rich.table import Table

from umsearch.cli.console import console
from umsearch.core.errors import ProfilingError
from umsearch.core.profile import Link, save_profile
from umsearch.measure.link import measure_link
from umsearch.measure.models import ModelSpec, build_model, parse_arg
from umsearch.measure.profiler import profile_model


@click.command("profile")
@click.argument("model")
@click.option("--arg", "args", multiple=True, help="Model argument KEY=VALUE (repeatable).")
@click.option("--sizes", default="1,2,4,8,16,32", show_default=True, help="Microbatch sizes to measure.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed repeats per layer and size (median).")
@click.option("--threads", type=int, default=1, show_default=True, help="CPU intra-op threads (as in the runtime).")
@click.option("--link-latency-ms", type=float, default=None, help="State the link latency instead of measuring it.")
@click.option("--link-bandwidth-gbps", type=float, default=None, help="State the link bandwidth (GB/s) instead of measuring it.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Output file (default MODEL_profile.json).")
def profile_command(model: str, args: tuple[str, ...], sizes: str, device: str, repeats: int, threads: int,
                    link_latency_ms: float | None, link_bandwidth_gbps: float | None, out: str | None) -> None:  # fmt: skip
    """Measure MODEL (zoo name or package.module:function) layer by layer."""
    try:
        size_list = [int(s) for s in sizes.split(",")]
    except ValueError:
        raise ProfilingError(f"--sizes {sizes!r} must be comma-separated integers like 1,2,4,8") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfilingError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    torch.set_num_threads(threads)
    spec = ModelSpec(source=model, args=dict(parse_arg(a) for a in args))
    built = build_model(spec)
    if (link_latency_ms is None) != (link_bandwidth_gbps is None):
        raise ProfilingError("give both --link-latency-ms and --link-bandwidth-gbps, or neither to measure the link")
    if link_latency_ms is None or link_bandwidth_gbps is None:
        with console.status("measuring the link (two processes, point to point)..."):
            link_latency_ms, link_bandwidth_gbps, _ = measure_link("nccl" if device == "cuda" else "gloo")
        console.print(f"link: {link_latency_ms:.3f} ms latency, {link_bandwidth_gbps:.2f} GB/s (measured)")
    total = len(built.layers) * len(size_list)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("profiling", total=total)
        prof = profile_model(built, spec, sizes=size_list, device=torch.device(device), repeats=repeats,
                             link=Link(latency_ms=link_latency_ms, bandwidth_gb_per_s=link_bandwidth_gbps),
                             tick=lambda name, b: bar.update(task, advance=1, description=f"{name} b={b}"))  # fmt: skip
    for c in prof.extra.get("calibration", []):
        if abs(c["error"]) > 0.15:
            console.print(f"[yellow]warning: layers {c['layers']} at size {c['size']} took {c['measured_ms']:.3f} ms "
                          f"end to end but their layers sum to {c['sum_ms']:.3f} ms ({c['error']:+.0%})[/]")  # fmt: skip
    if list(prof.microbatch_sizes) != size_list:
        console.print(f"[yellow]sizes above {prof.microbatch_sizes[-1]} ran out of memory and were skipped[/]")
    table = Table(title=f"profile of {model}")
    for col in ("layer", f"fwd ms @{prof.microbatch_sizes[-1]}", f"bwd ms @{prof.microbatch_sizes[-1]}", "out B/sample", "stash B/sample", "params B"):
        table.add_column(col, justify="right")
    for lay in prof.layers:
        table.add_row(lay.name, f"{lay.fwd_ms[-1]:.3f}", f"{lay.bwd_ms[-1]:.3f}", f"{lay.out_bytes:.0f}",
                      f"{lay.stash_bytes:.0f}", f"{lay.param_bytes:.0f}")  # fmt: skip
    console.print(table)
    path = Path(out or f"{model.replace(':', '_').replace('.', '_')}_profile.json")
    save_profile(prof, path)
    console.print(f"wrote {path}")
