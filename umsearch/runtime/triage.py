"""Failure triage: of everything the ranks of a launch reported, the one line that names the cause."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from umsearch.errors import RuntimeExecutionError


class RankFailure(RuntimeExecutionError):
    """A rank failed; ``str()`` is one line naming it; its traceback, if any, is attached as a note."""


def ranks_text(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


_PEER_LOST = re.compile(r"closed by peer|reset by peer|broken pipe|connection closed|connection refused|"
                        r"ECONNRESET|EPIPE|communicator was aborted|remote process exited|peer .* gone", re.I)  # fmt: skip
"""Errors a rank raises because another one went away: a consequence, never the cause."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def first_failure(errors: Sequence[dict[str, Any]], stopped: Sequence[dict[str, Any]], vanished: dict[int, float],
                  returncode: int | None, last_line: str) -> RuntimeExecutionError:  # fmt: skip
    """The failure that came first, as one line naming its rank.

    Causes before consequences: an error of a rank's own (earliest first);
    else a rank that vanished without a word (killed, out of memory, crashed;
    earliest seen first); else a rank stopped by a signal from outside the run;
    else an error about a lost peer; else torchrun's exit and last line.
    """
    own = sorted((e for e in errors if not _PEER_LOST.search(str(e.get("message", "")))), key=lambda e: e["time"])
    lost = sorted((e for e in errors if _PEER_LOST.search(str(e.get("message", "")))), key=lambda e: e["time"])
    # Distinct ranks: a rank stopped under a busy machine may both report its stop and be seen gone.
    others = len({e["rank"] for e in (*errors, *stopped)} | set(vanished)) - 1
    tail = f" ({others} other rank(s) failed or were stopped after it)" if others > 0 else ""
    if own or (lost and not vanished and not stopped):
        rep = (own or lost)[0]
        err = RankFailure(_error_line(rep) + tail)
        err.add_note(f"traceback of rank {rep['rank']}:\n{rep.get('traceback', '')}")
        return err
    if vanished:
        r = min(vanished, key=lambda k: vanished[k])
        return RankFailure(f"rank {r} died without reporting an error (killed by a signal such as SIGKILL, by the "
                           f"out-of-memory killer, or crashed); the other ranks were stopped{tail}")  # fmt: skip
    if stopped:
        rep = min(stopped, key=lambda e: e["time"])
        return RankFailure(f"rank {rep['rank']} was stopped by {rep.get('signal', 'a signal')} from outside the run; "
                           f"the other ranks were stopped too{tail}")  # fmt: skip
    code = "no exit code" if returncode is None else f"code {returncode}"
    return RuntimeExecutionError(f"torchrun exited with {code} and no rank reported an error; its last line: "
                                 f"{_one_line(last_line)}")  # fmt: skip


def _error_line(rep: dict[str, Any]) -> str:
    rank, message = rep.get("rank"), _one_line(rep.get("message", ""))
    if rep.get("domain"):
        # Runtime errors often name their rank already ("rank 1 gave up waiting ...").
        return message if message.startswith(f"rank {rank} ") else f"rank {rank}: {message}"
    return f"rank {rank} failed: {rep.get('type', 'Exception')}: {message}"
