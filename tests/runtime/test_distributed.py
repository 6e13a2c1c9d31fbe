"""Real torchrun processes over gloo: gradients equal single-process training, the time limit, a
deadlock stopped by the link timeout, and two "nodes" on this machine started with the command
``umsearch run --print-launch`` prints.

Every launch goes through ``python -m torch.distributed.run`` and the entry
point clusters use (:mod:`umsearch.runtime.torchrun`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.contract import (
    EXAMPLE3,
    EXAMPLE4,
    EXAMPLE5,
    EXAMPLE5_DEADLOCK,
    explicit_plan,
    warmup_plan,
)
from umsearch.cli.run import run_command
from umsearch.core.plan import Plan
from umsearch.core.plan_io import save_plan
from umsearch.errors import RuntimeExecutionError
from umsearch.nn.spec import BuiltModel
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import RankFailure, launch
from umsearch.runtime.run_plan import merge, run_plan

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _pythonpath() -> str:
    """The checkout first (the tests' own modules are model builders and launch targets), then the caller's."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
IN, WIDTH, OUT = 5, 6, 3
CFG = RunConfig(steps=1, seed=3, collect_grads=True, launch=LaunchConfig(timeout_s=60))
SGD_CFG = replace(CFG, steps=3, lr=0.1)


def tiny_layers(layers: int = 4) -> tuple[list[torch.nn.Module], Any]:
    """``layers`` float64 layers (Linear+Tanh blocks, a plain Linear last) and their batches; every
    sample independent, so any split of the batch gives the full-batch gradient exactly. Usable as
    ``--model tests.runtime.test_distributed:tiny_layers``."""
    dims = [IN] + [WIDTH] * (layers - 1) + [OUT]
    mods: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(dims, dims[1:], strict=False)):
        lin = torch.nn.Linear(a, b).double()
        mods.append(lin if i == layers - 1 else torch.nn.Sequential(lin, torch.nn.Tanh()))

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, IN, generator=g, dtype=torch.float64), torch.randn(b, OUT, generator=g, dtype=torch.float64)

    return mods, batch


def tiny_model(layers: int = 4, seed: int = 0) -> BuiltModel:
    torch.manual_seed(seed)
    mods, batch = tiny_layers(layers)
    return BuiltModel(mods, [f"l{i}" for i in range(layers)], batch, torch.nn.functional.mse_loss)


def reference(layers: int, batch: int, cfg: RunConfig, steps: int = 1, lr: float = 0.0,
              seed: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:  # fmt: skip
    """Single-process SGD: the loss of every step and the gradients of the last one."""
    model = tiny_model(layers, seed)
    net = torch.nn.Sequential(*model.layers)
    opt = torch.optim.SGD(net.parameters(), lr=lr or 1.0)
    losses = []
    for step in range(steps):
        x, y = model.make_batch(batch, torch.Generator().manual_seed(cfg.batch_seed(step)))
        opt.zero_grad()
        loss = model.loss(net(x), y)
        loss.backward()
        losses.append(loss.item())
        if step < steps - 1:  # the runtime also steps after the last iteration; grads are from before it
            opt.step()
    return losses, {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


def many_plans(rank: int, world: int, jobs: list[tuple[Plan, Any, RunConfig]]) -> list[Any]:
    """Launch target: several checked plans (pickled) in one set of processes (saves start-ups on a 2-core
    machine)."""
    from umsearch.runtime.worker import stage_worker

    return [stage_worker(rank, world, plan, factory, cfg) for plan, factory, cfg in jobs]


def _assert_grads(got: dict[str, torch.Tensor] | None, want: dict[str, torch.Tensor]) -> None:
    assert got is not None and sorted(got) == sorted(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)


def _one_stage_per_rank(batch: int, *lists: tuple[list[int], list[int], int, bool], layers: int = 6) -> Plan:
    plan = warmup_plan(batch, list(lists))
    cuts = [round(j * layers / len(lists)) for j in range(len(lists) + 1)]
    return replace(plan, stages=tuple(replace(s, layers=(cuts[j], cuts[j + 1])) for j, s in enumerate(plan.stages)))


def _on_layers(plan: Plan, layers: int) -> Plan:
    """The same schedule with its stages cut evenly from ``layers`` layers."""
    n = plan.num_stages
    cuts = [round(j * layers / n) for j in range(n + 1)]
    return replace(plan, stages=tuple(replace(s, layers=(cuts[j], cuts[j + 1])) for j, s in enumerate(plan.stages)))


PLANS = {
    "gpipe-unequal": _one_stage_per_rank(12, ([4, 8], [4, 8], 2, False), ([3, 3, 6], [3, 3, 6], 3, False)),
    "1f1b-unequal": _one_stage_per_rank(12, ([2, 4, 6], [2, 4, 6], 2, False), ([6, 6], [6, 6], 1, False)),
    "recompute": _one_stage_per_rank(12, ([4, 8], [6, 6], 2, True), ([3, 9], [12], 2, True)),
    "one-sample-messages": _one_stage_per_rank(12, ([1] * 12, [1] * 12, 12, False), ([1] * 12, [1] * 12, 12, False)),
    "interleaved": _on_layers(EXAMPLE3, 8),
    "zbv-iw": _on_layers(EXAMPLE4, 8),
    "unequal-interleaved": _on_layers(EXAMPLE5, 8),
}


def test_plan2_gradients_and_sgd_equal_single_process() -> None:
    jobs: list[tuple[Plan, Any, RunConfig]] = []
    for plan in PLANS.values():
        jobs.append((plan, functools.partial(tiny_model, plan.num_layers), CFG))
    sgd_plan = PLANS["1f1b-unequal"]
    jobs.append((sgd_plan, functools.partial(tiny_model, 6), SGD_CFG))
    per_rank = launch(many_plans, 2, (jobs,), CFG.launch)
    for i, (name, plan) in enumerate(PLANS.items()):
        result = merge([reports[i] for reports in per_rank])
        losses, want = reference(plan.num_layers, plan.global_batch, CFG)
        _assert_grads(result.grads, want)
        assert result.steps[0].loss == pytest.approx(losses[0], rel=1e-12), name
        records = result.steps[0].records
        assert sorted(str(a.label) for a in records) == sorted(str(a) for acts in plan.actions for a in acts)
        assert result.steps[0].iteration_ms == max(a.end_ms for a in records)
    # Three SGD steps of an unequal plan = three steps of single-process training.
    sgd = merge([reports[-1] for reports in per_rank])
    losses, grads = reference(6, 12, SGD_CFG, steps=SGD_CFG.steps, lr=SGD_CFG.lr)
    assert [s.loss for s in sgd.steps] == pytest.approx(losses, rel=1e-12)
    _assert_grads(sgd.grads, grads)


def sleeping(rank: int, world: int, seconds: float) -> int:
    time.sleep(seconds)
    return rank


def test_the_time_limit_counts_from_when_the_ranks_started() -> None:
    """Start-up (imports, rendezvous: seconds on a loaded machine) is not part of the limit: a run
    shorter than the limit passes however slowly it started, a stuck one is stopped."""
    assert launch(sleeping, 2, (1.0,), LaunchConfig(run_timeout_s=6)) == [0, 1]
    with pytest.raises(RuntimeExecutionError, match=r"^the run was still going 2 s after its ranks started; "
                                                    r"rank\(s\) 0, 1 still running were stopped"):  # fmt: skip
        launch(sleeping, 2, (600,), LaunchConfig(run_timeout_s=2))


def test_link_timeout_stops_a_deadlocked_run() -> None:
    """Forced past the checks, docs/model.md's deadlocking plan fails after --timeout, naming a rank."""
    cfg = RunConfig(steps=1, check=False, launch=LaunchConfig(timeout_s=3))
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"^rank [01]"):
        run_plan(_on_layers(EXAMPLE5_DEADLOCK, 4), functools.partial(tiny_model, 4), cfg)
    assert time.monotonic() - t0 < 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_nodes_on_this_machine_run_the_printed_command(tmp_path: Path) -> None:
    """Two torchrun launchers (one rank each) meet at a c10d rendezvous on 127.0.0.1, running the
    line ``--print-launch`` printed, unchanged; rank 0's report carries gradients equal to
    single-process training."""
    plan = explicit_plan(8, [0, 1], [[2, 6], [4, 4]], ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"], layers_per_stage=2)
    save_plan(plan, tmp_path / "plan.json")
    out = tmp_path / "report.json"
    args = [str(tmp_path / "plan.json"), "--print-launch", "--nnodes", "2", "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}", "--model", "tests.runtime.test_distributed:tiny_layers", "--arg",
            "layers=4", "--steps", "2", "--seed", "3", "--grads", "--out", str(out), "--timeout", "120"]  # fmt: skip
    lines = []
    for node in ("0", "1"):
        res = CliRunner().invoke(run_command, [*args, "--node-rank", node])
        assert res.exit_code == 0, res.output
        lines.append(res.stdout.strip().splitlines()[-1])
    assert lines[0] == lines[1]
    (tmp_path / "tmp").mkdir()
    # TMPDIR: torchrun keeps its log folder there; the test's own, not the machine's /tmp.
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": _pythonpath(),
           "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    nodes = [subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for line in lines]  # fmt: skip
    outputs = [n.communicate(timeout=400) for n in nodes]
    for n, (_, err) in zip(nodes, outputs, strict=True):
        assert n.returncode == 0, err[-3000:]
    rows = [json.loads(ln) for o, _ in outputs for ln in o.splitlines() if ln.startswith("{")]
    assert [r["step"] for r in rows] == [0, 1]  # printed once, by rank 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "umsearch.run/1" and len(doc["steps"]) == 2
    cfg = RunConfig(seed=3)
    losses, want = reference(4, 8, cfg, steps=2, lr=cfg.lr, seed=3)
    assert [s["loss"] for s in doc["steps"]] == pytest.approx(losses, rel=1e-12)
    got = {k: torch.tensor(v["values"], dtype=torch.float64).reshape(v["shape"]) for k, v in doc["grads"].items()}
    _assert_grads(got, want)


def test_torchrun_entry_point_refuses_a_deadlocking_plan(tmp_path: Path) -> None:
    save_plan(_on_layers(EXAMPLE5_DEADLOCK, 4), tmp_path / "plan.json", model={"source": "mlp", "args": {"layers": 3}})
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node=2", "-m",
         "umsearch.runtime.torchrun", str(tmp_path / "plan.json"), "--steps=1"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath(), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode != 0
    # Every rank refuses it when it loads the plan (the one gate), before it talks to a peer: either may speak.
    assert re.search(r"umsearch: rank [01]: \S*plan.json: the plan deadlocks", done.stderr), done.stderr[-2000:]


# ---------------------------------------------------------------------------
# Precision: a bf16 pipelined run equals the single-process bf16 run
# ---------------------------------------------------------------------------

BF16_CFG = replace(CFG, precision="bf16")


def tiny_model32(layers: int = 6, seed: int = 0) -> BuiltModel:
    """:func:`tiny_model` in float32: autocast casts float32 (not float64) to bf16."""
    built = tiny_model(layers, seed)
    mods = [m.float() for m in built.layers]

    def batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = built.make_batch(b, g)
        return x.float(), y.float()

    return BuiltModel(mods, built.names, batch, built.loss)


def reference_bf16(layers: int, batch: int, cfg: RunConfig, autocast: bool = True) -> dict[str, torch.Tensor]:
    """Single-process gradients of one full batch, the forward under bf16 autocast (or not)."""
    model = tiny_model32(layers)
    net = torch.nn.Sequential(*model.layers)
    x, y = model.make_batch(batch, torch.Generator().manual_seed(cfg.batch_seed(0)))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model.loss(net(x), y)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}


def test_bf16_pipelined_gradients_equal_the_single_process_bf16_run() -> None:
    names = ("1f1b-unequal", "interleaved", "zbv-iw")
    jobs = [(PLANS[n], functools.partial(tiny_model32, PLANS[n].num_layers), BF16_CFG) for n in names]
    per_rank = launch(many_plans, 2, (jobs,), BF16_CFG.launch)
    for i, name in enumerate(names):
        plan = PLANS[name]
        got = merge([reports[i] for reports in per_rank]).grads
        want = reference_bf16(plan.num_layers, plan.global_batch, BF16_CFG)
        fp32 = reference_bf16(plan.num_layers, plan.global_batch, BF16_CFG, autocast=False)
        assert got is not None and sorted(got) == sorted(want), name
        for k in want:
            # bf16 keeps 8 bits of mantissa: microbatches round their partial sums differently
            # from one full batch, so the two agree to bf16's precision, not bitwise.
            torch.testing.assert_close(got[k], want[k], rtol=3e-2, atol=2e-3, msg=f"{name} {k}")
        # ... and the run really was bf16: it is farther from fp32 than fp32 runs are from each other.
        assert max(float((got[k] - fp32[k]).abs().max()) for k in want) > 1e-5, name
