"""Settings of one ``umsearch run``, and the one table of its command-line flags.

Every run setting is a field of :class:`LaunchConfig`, :class:`RunConfig` or
:class:`ModelChoice`; a field that is also a flag says so in its metadata, an
:class:`~umsearch.core.options.Option` (the one way settings are declared). Three things are generated from that table and from nothing
else, so they cannot disagree: the click options of ``umsearch run`` /
``umsearch validate``, the argparse flags of the torchrun entry point
(:mod:`umsearch.runtime.torchrun`), and :func:`to_argv`, which writes configs
back as the entry point's flags (what a local run hands torchrun and what
``--print-launch`` prints). :func:`configs_from_values` is the inverse of both
parsers. Fields without a flag (``check``, ``start_timeout_s``) do not travel
on a command line: the entry point uses their defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from umsearch.core.model_spec import parse_arg
from umsearch.core.options import (
    Scope,
    Setting,
    float_in,
    int_at_least,
    int_in,
    kind_rule,
    nonempty,
    one_of,
    option,
    settings,
)
from umsearch.core.profile import PRECISIONS
from umsearch.errors import ModelSpecError, UmsearchError

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
"""The optimizers ``--optimizer`` names (:mod:`umsearch.runtime.zero1` builds them)."""

_STATE_FACTORS = {"sgd": 2.0, "adam": 4.0}


def state_factor_of(optimizer: str) -> float:
    """Bytes of training state per parameter byte that ``optimizer`` keeps (docs/model.md section 5):
    ``sgd`` 2 (weights and gradients), ``adam`` 4 (and its two moments)."""
    try:
        return _STATE_FACTORS[optimizer]
    except KeyError:
        raise FlagValueError(f"--optimizer takes one of {', '.join(OPTIMIZERS)}, got {optimizer!r}") from None


def optimizer_warning(optimizer: str, state_factor: float) -> str | None:
    """One line when ``optimizer`` keeps another state factor than the plan was planned with (None when
    they agree): the measured memory will not be the predicted one."""
    own = state_factor_of(optimizer)
    if own == state_factor:
        return None
    return (f"--optimizer {optimizer} keeps {own:g} bytes of state per parameter byte but the plan's memory "
            f"was predicted with state_factor {state_factor:g}: measured memory will differ from the prediction "
            f"(run with --optimizer {_closest(state_factor)}, or plan with --state-factor {own:g})")


def _closest(state_factor: float) -> str:
    return min(OPTIMIZERS, key=lambda name: abs(_STATE_FACTORS[name] - state_factor))


class FlagValueError(UmsearchError):
    """A flag got a value it does not take (the message names the flag and the fix)."""


def _nonnegative_float(name: str) -> Callable[[str], float]:
    return float_in(name, 0.0, float("inf"))


def _positive_float(name: str) -> Callable[[str], float]:
    return float_in(name, 0.0, float("inf"), lo_open=True)


MAX_THREADS = 1024
"""Most torch threads a rank (or the profiler) may be given."""


def _threads(text: str) -> int | None:
    value = int_in("--threads", 0, MAX_THREADS)(text)
    return value or None


def _show_threads(value: int | None) -> str:
    return str(value or 0)


def _model_arg(text: str) -> str:
    try:
        parse_arg(text)
    except ModelSpecError as exc:
        raise FlagValueError(str(exc)) from None
    return text


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the rank processes."""

    backend: str = field(default="gloo", metadata=option(
        kind="choice", choices=("gloo", "nccl"), flag="--backend", parse=one_of("--backend", ("gloo", "nccl")), metavar="[gloo|nccl]",
        help="gloo: CPU processes; nccl: one GPU per rank (cuda:LOCAL_RANK)."))  # fmt: skip
    """``gloo`` (CPU tensors) or ``nccl`` (one GPU per rank, ``cuda:LOCAL_RANK``)."""
    threads: int | None = field(default=1, metadata=option(
        kind="int", flag="--threads", parse=_threads, show=_show_threads, metavar="N",
        help="torch threads per rank (0: torch's default); on CPU each rank is pinned to its own cores "
             "when there are enough."))  # fmt: skip
    """``torch.set_num_threads`` in each rank (and ``OMP_NUM_THREADS``); None leaves torch's default."""
    timeout_s: float = field(default=300.0, metadata=option(
        kind="float", flag="--timeout", parse=_positive_float("--timeout"), show=repr, metavar="SECONDS",
        help="Seconds a rank may wait for a peer (every link) before the run fails."))  # fmt: skip
    """Seconds a rank may wait for a peer (every process group, pipeline links included) before it fails."""
    run_timeout_s: float | None = field(default=None, metadata=option(
        kind="float", flag="--time-limit", parse=_positive_float("--time-limit"), show=repr, scope="launcher",
        metavar="SECONDS",
        help="Stop a local run that is still going this many seconds after all its ranks started."))  # fmt: skip
    """Stop everything when a local run is still going this long after every rank has started (None:
    no limit). Start-up (imports, rendezvous) does not count: it is bounded by :attr:`start_timeout_s`."""
    start_timeout_s: float = 600.0
    """Give up on a local launch whose ranks have not all started (imported umsearch, joined the
    process group) this long after torchrun was started; generous, for loaded machines."""
    pin_cores: bool = field(default=True, metadata=option(
        flag="--no-pin-cores", kind="switch", invert=True,
        help="Do not pin CPU ranks to cores of their own."))  # fmt: skip
    """On CPU, pin each local rank to its own ``threads`` cores (``os.sched_setaffinity``) when the
    machine has enough of them, so that ranks do not migrate onto each other's cores."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How many iterations to run, with which data, optimizer and processes."""

    steps: int = field(default=20, metadata=option(
        kind="int", flag="--steps", parse=int_at_least(1, "--steps"), metavar="N", help="Iterations to run."))  # fmt: skip
    """Iterations (global batches) to run."""
    warmup_steps: int = field(default=2, metadata=option(
        kind="int", flag="--warmup-steps", parse=int_at_least(0, "--warmup-steps"), metavar="N",
        help="Leading iterations left out of the median and the spread."))  # fmt: skip
    """Leading iterations left out of the reported median and spread (allocator, caches warming up)."""
    seed: int = field(default=0, metadata=option(
        kind="int", flag="--seed", parse=int_at_least(0, "--seed"), metavar="N", help="Seed of weights and batches."))  # fmt: skip
    """Seed of the model weights and of the batches (batch i uses seed * 1_000_003 + i)."""
    lr: float = field(default=0.01, metadata=option(
        kind="float", flag="--lr", parse=_nonnegative_float("--lr"), show=repr, metavar="RATE",
        help="Learning rate of the optimizer (--optimizer)."))  # fmt: skip
    """Learning rate of :attr:`optimizer`."""
    optimizer: str = field(default="sgd", metadata=option(
        kind="choice", choices=OPTIMIZERS, flag="--optimizer", parse=one_of("--optimizer", OPTIMIZERS),
        metavar="[sgd|adam]",
        help="sgd: plain SGD (weights and gradients, state factor 2); adam: torch's Adam (two moments more, "
             "state factor 4; a zero1 plan shards them over the replicas)."))  # fmt: skip
    """The optimizer every rank steps (:data:`OPTIMIZERS`): ``sgd`` (no state of its own) or ``adam``
    (torch's defaults but the learning rate); what it holds per parameter byte is :func:`state_factor_of`."""
    check: bool = True
    """Refuse, before running, a plan that deadlocks or does not fit the model (in the launching
    process and again in every rank). Off only to test the runtime's own failure handling."""
    collect_grads: bool = field(default=False, metadata=option(
        flag="--grads", kind="switch",
        help="Also report every parameter's gradient after the last iteration (--json, --out): "
             "to check a plan against single-process training."))  # fmt: skip
    """Return every parameter's gradient after the last iteration."""
    precision: str | None = field(default=None, metadata=option(
        kind="choice", choices=PRECISIONS, flag="--dtype", parse=one_of("--dtype", PRECISIONS), metavar="[fp32|tf32|bf16|fp16]",
        help="Training precision (bf16/fp16: autocast; fp16 with loss scaling); default and only accepted "
             "value: the profile's."))  # fmt: skip
    """Training precision of the run (:data:`~umsearch.core.profile.PRECISIONS`); None: the profile's
    (the launcher resolves it and hands the ranks the value; a rank given None runs fp32)."""
    out: str | None = field(default=None, metadata=option(
        kind="path", flag="--out", parse=nonempty("--out"), metavar="FILE",
        help="Write the run's report (umsearch.run/1 JSON) here: the launcher on a local run, rank 0 "
             "on a cluster."))  # fmt: skip
    """Where the run's report goes (written by the launcher locally, by rank 0 on a cluster)."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Process start-up: backend, threads per rank, timeouts."""

    def check_warmup(self) -> None:
        """Raise :class:`FlagValueError` unless warm-up leaves at least one step to time.

        Checked where the user set ``--warmup-steps`` (a default of 2 with ``--steps 1`` times every step).
        """
        if self.warmup_steps >= self.steps:
            raise FlagValueError(f"--warmup-steps {self.warmup_steps} leaves none of --steps {self.steps} to "
                                 f"time; give fewer warm-up steps than steps (at most {self.steps - 1})")  # fmt: skip

    def batch_seed(self, step: int) -> int:
        """Seed of the generator that makes batch ``step`` (the same on every rank)."""
        return self.seed * 1_000_003 + step


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """What the user said on the command line about the plan's model and profile.

    A model named here is trusted (the user chose the code); a model read from
    the plan or its profile runs only if it is a zoo model or
    :attr:`trust_model_code` is set (:func:`umsearch.runtime.model_source.require_trusted`).
    """

    profile: str | None = field(default=None, metadata=option(
        kind="path", flag="--profile", parse=nonempty("--profile"), metavar="PROFILE.json",
        help="Profile of the plan (default: the one the plan names); its model_spec names the model "
             "when the plan does not."))  # fmt: skip
    """``--profile``: overrides the plan's own profile (prediction, and model when the plan names none)."""
    model: str | None = field(default=None, metadata=option(
        kind="text", flag="--model", parse=nonempty("--model"), metavar="SOURCE",
        help="Model to run instead of the plan's: a zoo name or package.module:function (trusted: you "
             "name the code)."))  # fmt: skip
    """``--model``: a zoo name or ``package.module:function``; replaces the plan's model."""
    model_args: tuple[str, ...] = field(default=(), metadata=option(
        flag="--arg", parse=_model_arg, kind="multiple", metavar="KEY=VALUE",
        help="Keyword argument of --model (repeatable); without any, the plan's own arguments are "
             "kept when it names the same model."))  # fmt: skip
    """``--arg KEY=VALUE`` texts, in order (parsed by :func:`umsearch.core.model_spec.parse_arg`)."""
    trust_model_code: bool = field(default=False, metadata=option(
        flag="--trust-model-code", kind="switch",
        help="Run a model the plan or profile file names even when it is not a zoo model (that "
             "imports and runs its module's code: only for files you trust)."))  # fmt: skip
    """Let a plan or profile file choose code outside the zoo (as Hugging Face's ``trust_remote_code``)."""


CONFIG_TYPES: tuple[type, ...] = (RunConfig, LaunchConfig, ModelChoice)
"""The dataclasses whose flagged fields make up the flag table."""


FLAGS: tuple[Setting, ...] = tuple(row for owner in CONFIG_TYPES for row in settings(owner))
"""Every flag, in declaration order; dests are unique across the config types."""
assert len({r.dest for r in FLAGS}) == len(FLAGS) and len({r.flag for r in FLAGS}) == len(FLAGS)
assert all(r.default is not dataclasses.MISSING for r in FLAGS), "a flagged field has a default"


def flags(scope: Scope | None = None) -> tuple[Setting, ...]:
    """The rows of ``scope`` (None: all of them)."""
    return tuple(r for r in FLAGS if scope is None or r.option.scope == scope)


def field_value(row: Setting, raw: Any) -> Any:
    """The field value of what a parser gave for ``row`` (a parsed value, a switch's bool, a list)."""
    return kind_rule(row.option).field_value(row.option, raw)


def configs_from_values(values: Mapping[str, Any]) -> tuple[RunConfig, ModelChoice]:
    """The configs that parsed flag values describe (click's kwargs or argparse's namespace as a dict,
    keyed by dest); a dest missing from ``values`` keeps its default."""
    by_owner: dict[type, dict[str, Any]] = {t: {} for t in CONFIG_TYPES}
    for row in FLAGS:
        if row.dest in values:
            by_owner[row.owner][row.dest] = field_value(row, values[row.dest])
    launch = LaunchConfig(**by_owner[LaunchConfig])
    return RunConfig(launch=launch, **by_owner[RunConfig]), ModelChoice(**by_owner[ModelChoice])


def _value_of(row: Setting, run: RunConfig, model: ModelChoice) -> Any:
    holder = {LaunchConfig: run.launch, RunConfig: run, ModelChoice: model}[row.owner]
    return getattr(holder, row.dest)


def to_argv(run: RunConfig, model: ModelChoice | None = None, scope: Scope = "ranks") -> list[str]:
    """``run`` and ``model`` as flags of ``scope`` (default: the entry point's); every value
    explicit, absent values (None, an empty list, a switch off) left out."""
    model = model or ModelChoice()
    argv: list[str] = []
    for row in flags(scope):
        argv += kind_rule(row.option).argv(row, _value_of(row, run, model))
    return argv
