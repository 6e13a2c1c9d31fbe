"""The launcher's refusals, its private folder and seals, its failure diagnosis, and the one flag
table that click, the entry point's argparse and ``to_argv`` all come from (no processes started
here except in the tests marked slow)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from umsearch.cli.run import run_command, split_values, validate_command
from umsearch.errors import RuntimeExecutionError
from umsearch.runtime.config import (
    FLAGS,
    LaunchConfig,
    ModelChoice,
    RunConfig,
    configs_from_values,
    flags,
    to_argv,
)
from umsearch.runtime.launch import ENTRY_MODULE, RankFailure, launch, torchrun_command
from umsearch.runtime.sealed import (
    RUN_DIR_PREFIX,
    check_private_dir,
    new_key,
    private_dir,
    read_sealed,
    seal,
    unseal,
    write_sealed,
)
from umsearch.runtime.torchrun import config_from_args, parser
from umsearch.runtime.triage import first_failure

# ---------------------------------------------------------------------------
# Stand-in launch targets (module level: the ranks import them by name)
# ---------------------------------------------------------------------------


def echo(rank: int, world: int, value: Any) -> tuple[int, int, Any, int]:
    return rank, world, value, os.getpid()


def sleeping(rank: int, world: int, seconds: float) -> int:
    time.sleep(seconds)
    return rank


def failing(rank: int, world: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` fails at once; the others wait for a message it never sends."""
    import torch
    import torch.distributed as dist

    if rank == bad_rank:
        raise ValueError(f"boom on rank {rank}")
    dist.recv(torch.zeros(1), src=bad_rank)
    return rank


# ---------------------------------------------------------------------------
# The flag table
# ---------------------------------------------------------------------------

_runs = st.builds(
    RunConfig,
    steps=st.integers(1, 10_000), warmup_steps=st.integers(0, 50), seed=st.integers(0, 2**40),
    lr=st.floats(0, 10, allow_nan=False), collect_grads=st.booleans(),
    out=st.none() | st.sampled_from(["r.json", "out dir/[x].json", "-odd.json"]),
    launch=st.builds(LaunchConfig, backend=st.sampled_from(["gloo", "nccl"]), threads=st.none() | st.integers(1, 64),
                     timeout_s=st.floats(1e-3, 1e6), pin_cores=st.booleans()),
)  # fmt: skip
_choices = st.builds(
    ModelChoice,
    profile=st.none() | st.sampled_from(["p.json", "a b/[c].json"]),
    model=st.none() | st.sampled_from(["gpt", "pkg.mod:fn"]),
    model_args=st.lists(st.sampled_from(["layers=2", "name=a=b", "flag=true", "x=-1.5"]), max_size=3).map(tuple),
    trust_model_code=st.booleans(),
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(_runs, _choices)
def test_entry_point_flags_round_trip(run: RunConfig, choice: ModelChoice) -> None:
    argv = to_argv(run, choice)
    assert configs_from_values(vars(parser().parse_args(["plan.json", *argv]))) == (run, choice)


@settings(max_examples=60, deadline=None)
@given(_runs, _choices, st.none() | st.floats(0.5, 1e4))
def test_click_reads_what_to_argv_writes(run: RunConfig, choice: ModelChoice, limit: float | None) -> None:
    """``umsearch run``'s options parse the entry point's flags plus the launcher's own to the same
    configs: one table, no drift between the two parsers."""
    from dataclasses import replace

    run = replace(run, launch=replace(run.launch, run_timeout_s=limit))
    argv = [*to_argv(run, choice), *to_argv(run, choice, scope="launcher")]
    ctx = run_command.make_context("run", ["plan.json", *argv])
    got_run, got_choice, extra = split_values(dict(ctx.params))
    assert (got_run, got_choice) == (run, choice)
    assert extra["plan_path"] == "plan.json"


def test_every_table_flag_is_an_option_of_both_parsers() -> None:
    click_names = {opt for p in run_command.params for opt in p.opts}
    argparse_names = {opt for a in parser()._actions for opt in a.option_strings}
    table = {row.flag for row in FLAGS}
    assert table <= click_names
    assert {row.flag for row in flags("ranks")} <= argparse_names
    assert not {row.flag for row in flags("launcher")} & argparse_names  # the launcher's own stay home
    # validate takes the table but its own --out, and rounds instead of steps.
    validate_names = {opt for p in validate_command.params for opt in p.opts}
    assert "--rounds" in validate_names and "--steps" not in validate_names and "--grads" not in validate_names


def test_entry_point_defaults_are_the_configs_defaults() -> None:
    assert config_from_args(parser().parse_args(["plan.json"])) == RunConfig()
    assert configs_from_values(vars(parser().parse_args(["plan.json"]))) == (RunConfig(), ModelChoice())
    ctx = run_command.make_context("run", ["plan.json"])
    assert split_values(dict(ctx.params))[:2] == (RunConfig(), ModelChoice())


def test_bad_flag_values_are_refused_by_both_parsers_with_the_same_words() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["plan.json", "--steps=0"])
    ctx_error = None
    try:
        run_command.make_context("run", ["plan.json", "--steps", "0"])
    except Exception as exc:  # noqa: BLE001 - click's usage error
        ctx_error = str(exc)
    assert ctx_error is not None and "--steps must be at least 1, got 0" in ctx_error
    with pytest.raises(Exception, match="must look like KEY=VALUE"):
        run_command.make_context("run", ["plan.json", "--arg", "layers"])


# ---------------------------------------------------------------------------
# The private folder and seals
# ---------------------------------------------------------------------------


def test_private_dir_is_0700_and_gone_afterwards() -> None:
    with private_dir() as d:
        info = d.lstat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        assert d.name.startswith(RUN_DIR_PREFIX)
        assert check_private_dir(d) == d
        (d / "x").write_text("partial")
    assert not d.exists()
    with pytest.raises(ValueError), private_dir() as d2:
        raise ValueError("whatever happens")
    assert not d2.exists()


@pytest.mark.parametrize("case", ["mode", "prefix", "symlink", "file", "missing"])
def test_check_private_dir_refuses_anything_else(tmp_path: Path, case: str) -> None:
    target = tmp_path / f"{RUN_DIR_PREFIX}x"
    target.mkdir(mode=0o700)
    target.chmod(0o700)
    path = target
    if case == "mode":
        target.chmod(0o755)
    elif case == "prefix":
        path = tmp_path / "elsewhere"
        path.mkdir(mode=0o700)
        path.chmod(0o700)
    elif case == "symlink":
        path = tmp_path / f"{RUN_DIR_PREFIX}link"
        path.symlink_to(target)
    elif case == "file":
        path = tmp_path / f"{RUN_DIR_PREFIX}file"
        path.write_text("")
    else:
        path = tmp_path / f"{RUN_DIR_PREFIX}none"
    with pytest.raises(RuntimeExecutionError, match="only for umsearch's own launcher|cannot be used"):
        check_private_dir(path)


def test_seals_refuse_other_keys_and_tampering() -> None:
    key = new_key()
    blob = seal(b"payload", key)
    assert unseal(blob, key, "x") == b"payload"
    with pytest.raises(RuntimeExecutionError, match="was not written by this launch"):
        unseal(blob, new_key(), "x")
    with pytest.raises(RuntimeExecutionError, match="was not written by this launch"):
        unseal(blob[:-1] + b"P", key, "x")
    with pytest.raises(RuntimeExecutionError, match="was not written by this launch"):
        unseal(b"short", key, "x")
    with private_dir() as d:
        write_sealed(d / "r", {"a": 1}, key)
        assert read_sealed(d / "r", key, "r") == {"a": 1}


def test_read_sealed_refuses_a_folder_that_is_not_private(tmp_path: Path) -> None:
    key = new_key()
    (tmp_path / "r").write_bytes(seal(b"\x80\x04K\x01.", key))
    with pytest.raises(RuntimeExecutionError, match="not a private launch folder"):
        read_sealed(tmp_path / "r", key, "r")


# ---------------------------------------------------------------------------
# Refusals and the command
# ---------------------------------------------------------------------------


def test_unpicklable_job_is_refused_with_the_reason() -> None:
    with pytest.raises(RuntimeExecutionError, match=r"^cannot hand the job to the rank processes: .*must be "
                                                    r"picklable: a module-level function"):  # fmt: skip
        launch(lambda rank, world: rank, 2)
    with pytest.raises(RuntimeExecutionError, match="must be picklable"):
        launch(echo, 2, (lambda: None,))


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(RuntimeExecutionError, match="unknown backend 'mpi'"):
        launch(echo, 2, (0,), LaunchConfig(backend="mpi"))


def test_local_command_is_torchrun_with_the_entry_point() -> None:
    cmd = torchrun_command(3, ["plan.json", "--steps=2"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--nproc-per-node=3" in cmd and "--max-restarts=0" in cmd
    assert cmd[-4:] == ["-m", ENTRY_MODULE, "plan.json", "--steps=2"]


# ---------------------------------------------------------------------------
# Which failure came first
# ---------------------------------------------------------------------------

_GLOO_LOST = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4"


def _err(rank: int, t: float, message: str, *, domain: bool = False, kind: str = "RuntimeError") -> dict[str, Any]:
    return {"rank": rank, "type": kind, "message": message, "domain": domain, "traceback": "tb", "time": t}


def test_own_error_comes_before_the_peers_it_broke() -> None:
    err = first_failure([_err(0, 1.0, _GLOO_LOST), _err(1, 2.0, "boom", kind="ValueError")], [], {}, 1, "")
    assert isinstance(err, RankFailure)
    assert str(err) == "rank 1 failed: ValueError: boom (1 other rank(s) failed or were stopped after it)"
    assert err.__notes__ == ["traceback of rank 1:\ntb"]


def test_a_vanished_rank_is_named_not_the_peer_that_lost_it() -> None:
    err = first_failure([_err(0, 1.0, _GLOO_LOST)], [{"rank": 2, "time": 3.0, "signal": "SIGTERM"}],
                        {1: 5.0}, -9, "")  # fmt: skip
    assert str(err).startswith("rank 1 died without reporting an error (killed by a signal such as SIGKILL")
    assert "(2 other rank(s) failed or were stopped after it)" in str(err)


def test_a_rank_seen_twice_is_one_other_rank() -> None:
    """The sibling of a failing rank may report losing its peer, report its stop and be seen gone, all three
    on a busy machine: it is still one other rank (test_failing_rank_stops_the_run_with_its_error said 2)."""
    err = first_failure([_err(1, 2.0, "boom", kind="ValueError"), _err(0, 3.0, _GLOO_LOST)],
                        [{"rank": 0, "time": 3.5, "signal": "SIGTERM"}], {0: 4.0}, 1, "")  # fmt: skip
    assert str(err) == "rank 1 failed: ValueError: boom (1 other rank(s) failed or were stopped after it)"


def test_earliest_vanished_earliest_stopped_then_lost_peer() -> None:
    assert str(first_failure([], [], {3: 2.0, 1: 1.0}, 1, "")).startswith("rank 1 died")
    stopped = [{"rank": 1, "time": 2.0, "signal": "SIGTERM"}, {"rank": 0, "time": 1.0, "signal": "SIGTERM"}]
    assert str(first_failure([], stopped, {}, 1, "")).startswith("rank 0 was stopped by SIGTERM from outside")
    lost = first_failure([_err(1, 2.0, _GLOO_LOST), _err(0, 1.0, _GLOO_LOST)], [], {}, 1, "")
    assert str(lost) == f"rank 0 failed: RuntimeError: {_GLOO_LOST} (1 other rank(s) failed or were stopped after it)"


def test_domain_errors_keep_their_words_and_everything_is_one_line() -> None:
    named = first_failure([_err(1, 1.0, "rank 1 gave up waiting\nfor a message", domain=True)], [], {}, 1, "")
    assert str(named) == "rank 1 gave up waiting for a message"
    plain = first_failure([_err(2, 1.0, "the plan deadlocks", domain=True)], [], {}, 1, "")
    assert str(plain) == "rank 2: the plan deadlocks"
    silent = first_failure([], [], {}, 2, "Traceback [/x]:\n  last\n")
    assert str(silent) == "torchrun exited with code 2 and no rank reported an error; its last line: Traceback [/x]: last"
    assert "\n" not in str(silent)


# ---------------------------------------------------------------------------
# Real launches (slow)
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_results_come_back_by_rank_and_nothing_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # let tempfile read TMPDIR again
    got = launch(echo, 2, ("hi",), LaunchConfig(timeout_s=60))
    assert [g[:3] for g in got] == [(0, 2, "hi"), (1, 2, "hi")]
    assert list(tmp_path.iterdir()) == []  # the private folder went with the launch
    for *_, pid in got:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_failing_rank_stops_the_run_with_its_error() -> None:
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match="^rank 1 failed: ValueError: boom on rank 1") as info:
        launch(failing, 2, (1,), LaunchConfig(timeout_s=120))
    # The sibling blocked in recv was stopped, not waited for until its 120 s link timeout.
    assert time.monotonic() - t0 < 60
    assert str(info.value) in ("rank 1 failed: ValueError: boom on rank 1",
                               "rank 1 failed: ValueError: boom on rank 1 (1 other rank(s) failed or were stopped after it)")  # fmt: skip
    assert any("boom on rank 1" in note for note in getattr(info.value, "__notes__", []))  # the rank's traceback
