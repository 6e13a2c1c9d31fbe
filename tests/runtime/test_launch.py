"""The launcher's refusals and the entry point's flags (no processes started here)."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import sleeping_worker
from umsearch.core.errors import RuntimeExecutionError
from umsearch.runtime.config import LaunchConfig, RunConfig
from umsearch.runtime.launch import ENTRY_MODULE, launch, torchrun_command
from umsearch.runtime.torchrun import config_from_args, parser


def test_unpicklable_job_is_refused_with_the_reason() -> None:
    with pytest.raises(RuntimeExecutionError, match=r"^cannot hand the job to the stage processes: .*must be "
                                                    r"picklable: a module-level function"):  # fmt: skip
        launch(lambda rank, world: rank, 2)
    with pytest.raises(RuntimeExecutionError, match="must be picklable"):
        launch(sleeping_worker, 2, (lambda: None,))


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(RuntimeExecutionError, match="unknown backend 'mpi'"):
        launch(sleeping_worker, 2, (0, "."), LaunchConfig(backend="mpi"))


def test_local_command_is_torchrun_with_the_entry_point() -> None:
    cmd = torchrun_command(3, ["plan.json", "--steps=2"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--nproc-per-node=3" in cmd
    assert cmd[-4:] == ["-m", ENTRY_MODULE, "plan.json", "--steps=2"]


@pytest.mark.parametrize("cfg", [
    RunConfig(),
    RunConfig(steps=3, warmup_steps=0, seed=5, lr=0.125,
              launch=LaunchConfig(backend="nccl", threads=None, timeout_s=7.5, pin_cores=False)),
])  # fmt: skip
def test_entry_point_flags_round_trip(cfg: RunConfig) -> None:
    assert config_from_args(parser().parse_args(["plan.json", *cfg.to_argv()])) == cfg


def test_entry_point_defaults_are_run_configs() -> None:
    assert config_from_args(parser().parse_args(["plan.json"])) == RunConfig()
