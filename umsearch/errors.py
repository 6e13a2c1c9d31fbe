"""Domain exceptions: every error a user can cause names the bad value and the fix.

The CLI turns any :class:`UmsearchError` into one red line and exit code 1;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UmsearchError(Exception):
    """Base of all user-facing errors. ``str(err)`` is the whole message."""


class ProfileError(UmsearchError):
    """A profile JSON is malformed or violates docs/model.md section 1."""


class PlanError(UmsearchError):
    """A plan JSON is malformed or violates docs/model.md section 2."""


class SearchSpaceError(UmsearchError):
    """A search-space TOML (or a flag overriding it) has a bad key or value."""


class NoFeasiblePlanError(UmsearchError):
    """No plan found fits the memory limit."""


class ModelSpecError(UmsearchError):
    """A model reference (zoo name or package.module:function) is malformed or not trusted."""


class ProfilingError(UmsearchError):
    """Measuring a model failed in a way the user can fix (bad model, no CUDA, ...)."""


class OutputError(UmsearchError):
    """An output file or folder cannot be written (or writing it would destroy something)."""


class RuntimeExecutionError(UmsearchError):
    """Executing a plan with the distributed runtime failed."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM, SIGHUP, SIGINT) asked a long job to stop; it stops as for Ctrl-C and keeps its work.

    ``signum`` says which; a command exits with ``128 + signum`` as a shell reports it (SIGTERM 143).
    """

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum
