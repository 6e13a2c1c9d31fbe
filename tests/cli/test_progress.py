"""Progress anywhere (issue 31 item 3): ``--progress`` bars on a terminal, plain lines in a log (a batch
job), or nothing; lines throttled, with the elapsed time and an estimate of what remains."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.cli.helpers import run_cli
from tests.strategies import uniform_profile
from umsearch.cli import progress
from umsearch.cli.main import cli
from umsearch.cli.progress import MODES, Reporter, duration, progress_line, progress_option, resolve
from umsearch.core.profile import save_profile


class Clock:
    """A clock the test sets by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _lines(label: str = "profile") -> tuple[Clock, list[str], Reporter]:
    clock, out = Clock(), list[str]()
    return clock, out, Reporter("lines", label, clock=clock, write=out.append)


def test_a_line_says_the_step_the_elapsed_time_and_what_remains() -> None:
    assert progress_line("profile", 12, 40, "timing round 3", elapsed_s=41.0, left_s=95.6) == \
        "[profile] 12/40 timing round 3 · elapsed 0:41 · about 1:35 left"  # fmt: skip
    assert progress_line("search", 3, 10, "nsga2", info="best 9.000 ms · scored 80", elapsed_s=3725.0) == \
        "[search] 3/10 nsga2 · best 9.000 ms · scored 80 · elapsed 1:02:05"  # fmt: skip
    assert progress_line("profile", 3, None, "chain pass b=4", elapsed_s=5.9) == "[profile] 3 chain pass b=4 · elapsed 0:05"
    assert progress_line("profile", 1, 2, "timing my\nlayer", info="a\nb", elapsed_s=0.0) == \
        "[profile] 1/2 timing my layer · a b · elapsed 0:00"  # a user's layer name cannot break the line  # fmt: skip
    assert [duration(s) for s in (0.0, 59.99, 60.0, 3599.0, 3600.0, 36000.5, -1.0)] == \
        ["0:00", "0:59", "1:00", "59:59", "1:00:00", "10:00:00", "0:00"]  # fmt: skip


def test_the_estimate_is_the_rate_so_far() -> None:
    clock, out, shown = _lines()
    with shown:
        clock.t = 10.0
        shown.update(4, 40, "timing round 1")  # 4 steps in 10 s: 36 more take 90 s
        clock.t = 41.0
        shown.update(12, 40, "timing round 3")  # 12 in 41 s: 28 more take 95.7 s
    assert out == ["[profile] 4/40 timing round 1 · elapsed 0:10 · about 1:30 left",
                   "[profile] 12/40 timing round 3 · elapsed 0:41 · about 1:35 left"]  # fmt: skip


def test_an_unknown_total_nothing_done_or_everything_done_gives_no_estimate() -> None:
    clock, out, shown = _lines()
    with shown:
        shown.update(0, 5, "starting")
        clock.t = 3.0
        shown.update(2, None, "chain pass b=2")
        clock.t = 6.0
        shown.update(5, 5, "done")
    assert out == ["[profile] 0/5 starting · elapsed 0:00", "[profile] 2 chain pass b=2 · elapsed 0:03",
                   "[profile] 5/5 done · elapsed 0:06"]  # fmt: skip


def test_lines_are_throttled_but_a_phases_last_step_always_prints() -> None:
    clock, out, shown = _lines("search")
    with shown:
        for step in range(1, 41):  # 40 steps, 0.25 s apart: 10 s in all
            clock.t = step / 4
            shown.update(step, 40, "nsga2", phase="nsga2")
    # The first step, then one every 2 s (steps 9, 17, 25, 33), then the last.
    assert [line.split(" · ")[0] for line in out] == [f"[search] {n}/40 nsga2" for n in (1, 9, 17, 25, 33, 40)]
    assert out[1] == "[search] 9/40 nsga2 · elapsed 0:02 · about 0:07 left"  # 2.25 s x 31 / 9 = 7.75 s
    assert out[-1] == "[search] 40/40 nsga2 · elapsed 0:10"


def test_the_estimate_counts_from_where_the_phase_began() -> None:
    clock, out, shown = _lines("search")
    with shown:
        clock.t = 30.0
        shown.update(3, 3, "baselines", phase="baselines")
        clock.t = 40.0
        shown.update(1, 4, "polish", phase="polish")  # 1 climb in the 10 s since the baselines ended: 3 more, 30 s
    assert out == ["[search] 3/3 baselines · elapsed 0:30", "[search] 1/4 polish · elapsed 0:40 · about 0:30 left"]


def test_advance_counts_one_step_at_a_time_and_takes_a_changed_total() -> None:
    clock, out, shown = _lines()
    with shown:
        shown.advance("chain pass b=1", total=9)
        clock.t = 4.0
        shown.advance("chain pass b=2", total=9)
        clock.t = 8.0
        shown.advance("timing round 1", total=5)  # the exact total, once pooled
    assert out == ["[profile] 1/9 chain pass b=1 · elapsed 0:00",  # no time gone by: no rate yet
                   "[profile] 2/9 chain pass b=2 · elapsed 0:04 · about 0:14 left",
                   "[profile] 3/5 timing round 1 · elapsed 0:08 · about 0:05 left"]  # fmt: skip


@pytest.mark.parametrize("mode", ["bars", "none"])
def test_bars_and_none_write_no_lines(mode: str) -> None:
    out: list[str] = []
    with Reporter(mode, "search", clock=Clock(), write=out.append) as shown:
        shown.update(1, 2, "nsga2", phase="nsga2")
        shown.update(2, 2, "nsga2", phase="nsga2")
    assert out == [] and shown.mode == mode


class _Terminal:
    def isatty(self) -> bool:
        return True


def test_auto_is_bars_on_a_terminal_lines_elsewhere_and_none_when_quiet() -> None:
    assert resolve("auto", stream=_Terminal()) == "bars"
    assert resolve("auto", stream=object()) == "lines"  # no isatty at all: not a terminal
    assert resolve("auto", quiet=True, stream=_Terminal()) == "none"  # --json, --quiet: as before
    assert [resolve(m, quiet=True) for m in ("bars", "lines", "none")] == ["bars", "lines", "none"]  # stated: kept
    with pytest.raises(ValueError, match="'dots' is not one of auto, bars, lines, none"):
        resolve("dots")


def test_auto_picks_lines_when_stderr_is_not_a_terminal() -> None:
    @click.command()
    @progress_option
    def mode(progress: str) -> None:
        click.echo(Reporter(progress, "x").mode)

    assert CliRunner().invoke(mode, []).stdout == "lines\n"  # CliRunner's stderr is no terminal
    assert CliRunner().invoke(mode, ["--progress", "none"]).stdout == "none\n"
    res = CliRunner().invoke(mode, ["--progress", "dots"])
    assert res.exit_code == 2 and "'dots' is not one of 'auto', 'bars', 'lines', 'none'" in res.stderr


@pytest.mark.parametrize("command", ["profile", "calibrate", "search", "tune", "run"])
def test_every_long_command_has_the_same_progress_flag(command: str) -> None:
    found = cli.get_command(click.Context(cli), command)
    assert found is not None
    [param] = [p for p in found.params if p.name == "progress"]
    assert isinstance(param, click.Option) and isinstance(param.type, click.Choice)
    assert param.opts == ["--progress"] and tuple(param.type.choices) == MODES and param.default == "auto"


def test_search_prints_progress_lines_on_stderr_and_clean_json_on_stdout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    save_profile(uniform_profile(), tmp_path / "prof.json")
    monkeypatch.setattr(progress, "CLOCK", lambda: 0.0)  # a stopped clock: the first line and each phase's last
    code, out, err = run_cli(capsys, "search", "--profile", str(tmp_path / "prof.json"), "--ranks", "2", "--batch",
                             "8", "--generations", "1", "--population", "8", "--polish-rounds", "1", "--out",
                             str(tmp_path / "res"), "--json", "--progress", "lines")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["iteration_ms"] == 9.0
    assert err.splitlines() == [
        "[search] 0/7 baselines · best - · scored 0 · elapsed 0:00",
        "[search] 7/7 baselines · best - · scored 80 · elapsed 0:00",
        "[search] 1/1 first pass · best 9.000 ms · scored 290 · elapsed 0:00",
        "[search] 1/1 nsga2 · best 9.000 ms · scored 318 · elapsed 0:00",
        # Plans scored follow the polish chains' random streams (one per chain: umsearch/search/chains.py) and
        # their list descents (umsearch/search/local.py).
        "[search] 3/3 polish · best 9.000 ms · scored 17441 · elapsed 0:00",
        "[search] 1/1 refine · best 9.000 ms · scored 17446 · elapsed 0:00",
    ]
