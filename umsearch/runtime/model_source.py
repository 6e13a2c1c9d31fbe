"""Which model a plan runs, whether umsearch may run its code, and the slices the stages keep.

A plan made by the search names its model under ``model``; a hand-written
plan may instead name a profile whose ``model_spec`` says it; the user may
name one with ``--model`` (:func:`user_model`). The plan file's gate,
:func:`umsearch.core.loader.load_plan_file`, resolves which model it is;
:func:`require_trusted` applies the one rule about code
(:mod:`umsearch.core.model_spec`): a zoo model, or a model the user named, is
built; any other model a data file names is built only with
``--trust-model-code``. The launcher and every rank pass the gate the same
:class:`~umsearch.runtime.config.ModelChoice` (its profile, :func:`user_model`
and its trust), so a plan started straight with torchrun on a cluster is held
to the same rule.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from umsearch.core.loader import LoadedPlan
from umsearch.core.model_spec import ModelSpec, parse_arg
from umsearch.errors import ModelSpecError, PlanError, ProfilingError
from umsearch.runtime.config import ModelChoice


class ModelLike(Protocol):
    """What the runtime needs of a model (:class:`umsearch.nn.spec.BuiltModel` is one)."""

    @property
    def layers(self) -> Sequence[torch.nn.Module]: ...
    @property
    def make_batch(self) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]: ...
    @property
    def loss(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]: ...


ModelFactory = Callable[[], ModelLike]
"""Builds the same model (same weights) every time it is called; must be picklable."""


def user_model(choice: ModelChoice) -> ModelSpec | None:
    """The model the user named with ``--model`` / ``--arg`` (trusted), or None."""
    if choice.model is None:
        if choice.model_args:
            raise ModelSpecError(f"--arg {choice.model_args[0]!r} needs --model: it is an argument of the "
                                 "model you name; drop it or add --model SOURCE")  # fmt: skip
        return None
    args = dict(parse_arg(a) for a in choice.model_args)
    return ModelSpec.from_json({"source": choice.model, "args": args}, "--model", trust=True)


def require_trusted(loaded: LoadedPlan) -> ModelSpec:
    """The plan's model spec; raises ModelSpecError (naming both ways out) unless umsearch may build it."""
    spec = loaded.require_model()
    if not spec.trusted:
        raise ModelSpecError(
            f"{loaded.path} names the model {spec.source!r}, which is not a zoo model: building it would import "
            f"and run that module's code; name it yourself (--model {spec.source}) or pass --trust-model-code "
            "if you trust the file"
        )
    return spec


MAX_ZOO_LAYERS = 10_000
"""Most ``layers`` a zoo model is built with by the runtime (a larger one takes minutes only to be refused)."""


def check_spec_size(spec: ModelSpec) -> None:
    """Refuse, from the spec's arguments and before anything is built, a zoo model too large to build:
    one whose ``layers`` argument is over :data:`MAX_ZOO_LAYERS`."""
    n = spec.args.get("layers")
    if not spec.is_zoo or isinstance(n, bool) or not isinstance(n, int):
        return  # another model's size is its own code's; a bad type is the builder's error
    if n > MAX_ZOO_LAYERS:
        raise PlanError(f"the model {spec.source!r} with layers={n} is over the runtime's limit of "
                        f"{MAX_ZOO_LAYERS} layers; fix the plan's 'model' entry (or --arg layers=N)")  # fmt: skip


def _build(spec: ModelSpec, seed: int) -> ModelLike:
    from umsearch.nn.models import build_model

    check_spec_size(spec)
    try:
        return build_model(spec, seed=seed)
    except ModelSpecError:
        raise
    except ProfilingError as exc:
        # The builder's errors speak of profiling; here the model comes from the plan or --model.
        raise PlanError(f"cannot build the model {spec.source!r}: {exc}; fix the plan's 'model' entry "
                        "(or its profile's 'model_spec', or --model/--arg)") from None  # fmt: skip
    except Exception as exc:
        # The model's own code failed: one line here, its traceback under UMSEARCH_DEBUG=1.
        raise PlanError(f"building the model {spec.source!r} failed: {type(exc).__name__}: {exc}") from exc


def spec_factory(spec: ModelSpec, seed: int = 0) -> ModelFactory:
    """A picklable factory building ``spec`` with weights fixed by ``seed`` (refuses an untrusted spec
    when called, not when made)."""
    return functools.partial(_build, spec, seed)


def stage_module(model: ModelLike, lo: int, hi: int) -> torch.nn.Sequential:
    """Layers ``[lo, hi)`` as one module; parameter names keep the global layer index."""
    return torch.nn.Sequential(OrderedDict((str(i), model.layers[i]) for i in range(lo, hi)))
