"""Data files never choose code to run; the launcher's hidden flags read only its own sealed files.

Every test plants a *marker command* (``touch MARKER``) where a hostile plan,
profile or job file would put its payload, and checks that the marker file
never appears unless the user named the code or passed ``--trust-model-code``.
"""

from __future__ import annotations

import ast
import os
import pickle
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.contract import warmup_plan
from tests.strategies import uniform_profile
from umsearch.cli.run import run_command, validate_command
from umsearch.core.plan_io import save_plan
from umsearch.core.profile import save_profile
from umsearch.runtime.config import LaunchConfig
from umsearch.runtime.launch import launch
from umsearch.runtime.sealed import JOB_FILE, KEY_ENV, RUN_DIR_PREFIX, new_key, seal

ROOT = Path(__file__).resolve().parents[2]


def _pythonpath() -> str:
    """The checkout first (the tests' own modules are model builders and launch targets), then the caller's."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
LAYERS = 3  # the zoo's mlp with layers=2: two Linear+Tanh blocks and the classifier


def _payloads(marker: Path) -> list[dict[str, Any]]:
    """The two classic ways a model spec could run a shell command."""
    return [
        {"source": "os:system", "args": {"command": f"touch {marker}"}},
        {"source": "subprocess:run", "args": {"args": f"touch {marker}", "shell": True}},
    ]


def _plan_file(tmp: Path, *, model: dict[str, Any] | None = None, profile: str | None = None,
               ranks: int = 2) -> Path:  # fmt: skip
    ones = [1, 1]
    lists = [(ones, ones, 2 - j, False) for j in range(ranks)]
    plan = warmup_plan(2, lists)
    if ranks == 1:
        plan = replace(plan, stages=(replace(plan.stages[0], layers=(0, LAYERS)),))
    else:
        plan = replace(plan, stages=(replace(plan.stages[0], layers=(0, 1)), replace(plan.stages[1], layers=(1, LAYERS))))
    meta: dict[str, Any] = {}
    if model is not None:
        meta["model"] = model
    if profile is not None:
        meta["profile"] = profile
    return save_plan(plan, tmp / "plan.json", **meta)


def _profile(tmp: Path, model_spec: dict[str, Any] | None = None) -> Path:
    prof = uniform_profile(layers=LAYERS)
    if model_spec is not None:
        prof = replace(prof, extra={"model_spec": model_spec})
    return save_profile(prof, tmp / "prof.json")


def _one_red_line(res: Result) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


REFUSAL = "not a zoo model: building it would import and run that module's code"


@pytest.mark.parametrize("which", [0, 1], ids=["os.system", "subprocess.run-shell"])
def test_a_plans_model_runs_no_code_in_run_validate_or_print_launch(tmp_path: Path, which: int) -> None:
    marker = tmp_path / "MARKER"
    _profile(tmp_path)
    plan = str(_plan_file(tmp_path, model=_payloads(marker)[which], profile="prof.json"))
    for cmd, args in ((run_command, [plan]), (run_command, [plan, "--print-launch"]),
                      (run_command, [plan, "--print-launch", "--nnodes", "2", "--rdzv-endpoint", "h:1"]),
                      (validate_command, [plan])):  # fmt: skip
        res = CliRunner().invoke(cmd, args)
        assert res.exit_code == 1, res.output
        line = _one_red_line(res)
        assert REFUSAL in line and "--trust-model-code" in line and "--model" in line
        assert not marker.exists()


def test_a_profiles_model_spec_runs_no_code(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    _profile(tmp_path, model_spec=_payloads(marker)[1])
    plan = str(_plan_file(tmp_path, profile="prof.json"))
    for args in ([plan], [plan, "--print-launch"], [plan, "--profile", str(tmp_path / "prof.json")]):
        res = CliRunner().invoke(run_command, args)
        assert res.exit_code == 1 and REFUSAL in _one_red_line(res)
    res = CliRunner().invoke(validate_command, [plan])
    assert res.exit_code == 1 and REFUSAL in _one_red_line(res)
    assert not marker.exists()


def test_print_launch_builds_nothing_even_when_the_code_is_trusted(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    plan = str(_plan_file(tmp_path, model=_payloads(marker)[0]))
    res = CliRunner().invoke(run_command, [plan, "--print-launch", "--trust-model-code"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1].endswith("--trust-model-code")  # passed on to every rank
    res = CliRunner().invoke(run_command, [plan, "--print-launch", "--model", "os:system", "--arg",
                                           f"command=touch {marker}"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"--model=os:system '--arg=command=touch {marker}'" in res.stdout
    assert not marker.exists()


def test_trust_model_code_lets_the_launcher_build_the_files_model(tmp_path: Path) -> None:
    """The flag does what it says (the marker runs), and the model then fails in one line."""
    marker = tmp_path / "MARKER"
    plan = str(_plan_file(tmp_path, model=_payloads(marker)[0]))
    res = CliRunner().invoke(run_command, [plan, "--trust-model-code"])
    assert marker.exists()
    assert res.exit_code == 1 and "must return (layers, make_batch)" in _one_red_line(res)


def _entry(args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The torchrun entry point as one rank, the way a cluster's torchrun starts it."""
    base = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    full = {**base, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
            "PYTHONPATH": _pythonpath(), **env}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "umsearch.runtime.torchrun", *args], cwd=tmp, env=full,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_the_entry_point_refuses_a_files_model_in_every_rank(tmp_path: Path) -> None:
    """A plan started straight with torchrun on a cluster is held to the same rule."""
    marker = tmp_path / "MARKER"
    _profile(tmp_path, model_spec=_payloads(marker)[0])
    for i, model in enumerate([_payloads(marker)[0], None]):
        plan = _plan_file(tmp_path, model=model, profile=None if i == 0 else "prof.json")
        for rank in ("0", "1"):
            done = _entry([str(plan), "--steps=1"], tmp_path, RANK=rank, LOCAL_RANK=rank)
            assert done.returncode == 1
            assert f"umsearch: rank {rank}: " in done.stderr and REFUSAL in done.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_the_entry_point_passes_trust_model_code_on_to_the_rank(tmp_path: Path) -> None:
    """With the flag, the rank builds the file's model (the marker runs), then refuses what it returned."""
    import socket

    marker = tmp_path / "MARKER"
    plan = _plan_file(tmp_path, model=_payloads(marker)[0], ranks=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _entry([str(plan), "--steps=1", "--trust-model-code"], tmp_path, WORLD_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    assert marker.exists()
    assert done.returncode == 1 and "must return (layers, make_batch)" in done.stderr


def test_the_entry_point_checks_the_world_size_before_anything(tmp_path: Path) -> None:
    plan = _plan_file(tmp_path, model={"source": "mlp", "args": {"layers": 2}})
    done = _entry([str(plan)], tmp_path, WORLD_SIZE="3")
    assert done.returncode == 1
    assert "the plan has 2 rank(s) but torchrun started 3 process(es)" in done.stderr


class _Payload:
    """Unpickling this runs ``touch marker``: what a hostile job file would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _private(tmp: Path) -> Path:
    d = tmp / f"{RUN_DIR_PREFIX}forged"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    return d


def test_job_flag_reads_only_the_launchers_sealed_file(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    evil = pickle.dumps(_Payload(marker))
    (tmp_path / "evil.pkl").write_bytes(evil)
    private = _private(tmp_path)
    (private / JOB_FILE).write_bytes(evil)
    key = new_key()
    attempts = [
        # no key: not started by the launcher at all
        (["--job", str(tmp_path / "evil.pkl"), f"--result-dir={tmp_path}"], {}),
        (["--job", str(private / JOB_FILE), f"--result-dir={private}"], {}),
        # a key, but the folder is not private / the job is elsewhere / the file is not sealed with it
        (["--job", str(tmp_path / "evil.pkl"), f"--result-dir={tmp_path}"], {KEY_ENV: key.hex()}),
        (["--job", str(tmp_path / "evil.pkl"), f"--result-dir={private}"], {KEY_ENV: key.hex()}),
        (["--job", str(private / JOB_FILE), f"--result-dir={private}"], {KEY_ENV: key.hex()}),
        (["--job", str(private / JOB_FILE)], {KEY_ENV: key.hex()}),
    ]
    (private / "sealed-elsewhere").write_bytes(seal(evil, new_key()))
    for args, env in attempts:
        done = _entry(args, tmp_path, **env)
        assert done.returncode == 1, done.stderr
        assert "umsearch: rank 0: " in done.stderr
        assert not marker.exists(), args
    # and the same refusal for --result-dir alone: it is the launcher's as well
    done = _entry([str(_plan_file(tmp_path, model={"source": "mlp", "args": {"layers": 2}})),
                   f"--result-dir={tmp_path}"], tmp_path)  # fmt: skip
    assert done.returncode == 1 and "only for umsearch's own launcher" in done.stderr


def test_nothing_in_the_package_unpickles_but_the_sealed_reader() -> None:
    """No pickle.load(s) or torch.load of a user's file anywhere in umsearch: only the launcher's
    :func:`read_sealed`, after the seal and the folder are checked."""
    found = []
    for path in sorted((ROOT / "umsearch").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    owner = node.func.value
                    name = owner.id if isinstance(owner, ast.Name) else ""
                    if (name, node.func.attr) in {("pickle", "load"), ("pickle", "loads"), ("torch", "load"),
                                                  ("pickle", "Unpickler")}:  # fmt: skip
                        found.append(f"{path.relative_to(ROOT)}:{fn.name}")
    assert found == ["umsearch/runtime/sealed.py:read_sealed"]


def private_state(rank: int, world: int) -> dict[str, Any]:
    """Launch target: what a rank sees of the launch's folder."""
    folder = Path(os.environ["TMPDIR"])
    info = folder.lstat()
    return {"folder": str(folder), "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid,
            "job_mode": stat.S_IMODE((folder / JOB_FILE).lstat().st_mode), "key": bool(os.environ.get(KEY_ENV))}


@pytest.mark.slow
def test_a_launchs_files_live_in_a_private_folder_that_goes_with_it() -> None:
    got = launch(private_state, 2, (), LaunchConfig(timeout_s=60))
    assert got[0] == got[1]
    state = got[0]
    assert state["mode"] == 0o700 and state["uid"] == os.getuid() and state["job_mode"] == 0o600 and state["key"]
    assert Path(state["folder"]).name.startswith(RUN_DIR_PREFIX)
    assert not Path(state["folder"]).exists()
