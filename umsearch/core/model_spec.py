"""Which model a profile or plan is for, and whether umsearch may run its code.

A spec is a zoo name (``gpt``, ``vgg16``, ``mlp``: code that ships with
umsearch), a Hugging Face causal LM by its config (``hf:llama``, ``hf:./folder``:
transformers' own classes, no remote code, :mod:`umsearch.nn.hf`) or
``package.module:function`` with keyword arguments. Importing a
module runs its code, so a spec read from a data file (a plan's ``model``, a
profile's ``model_spec``) never chooses code to run by itself: a non-zoo spec
from a file is *untrusted* and is built only when the user names the same
module on the command line or passes ``--trust-model-code``
(:func:`umsearch.nn.models.build_model` enforces it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umsearch.errors import ModelSpecError

ZOO_NAMES = ("gpt", "vgg16", "mlp", "hybrid")
"""Models that ship with umsearch (:mod:`umsearch.nn.zoo`); with ``hf:`` models, the only sources a file may
name freely."""
HF_PREFIX = "hf:"
"""The source prefix of a Hugging Face model (:mod:`umsearch.nn.hf`)."""

_ARG_TYPES = (str, int, float, bool)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A rebuildable model reference, recorded in profiles (``model_spec``) and plans (``model``)."""

    source: str
    """Zoo name or ``package.module:function``."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments (JSON scalars) for the builder."""
    trusted: bool = True
    """False when the spec came from a data file and names code outside the zoo: building it is refused."""

    @property
    def is_zoo(self) -> bool:
        return self.source in ZOO_NAMES

    @property
    def is_hf(self) -> bool:
        """A Hugging Face model by its config (``hf:NAME``): built from transformers' own classes."""
        return self.source.startswith(HF_PREFIX)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "args": dict(self.args)}

    @classmethod
    def from_json(cls, obj: Any, where: str = "model spec", *, trust: bool = False) -> ModelSpec:
        """A spec read from a file: trusted only when it names a zoo model or ``trust`` is given."""
        fix = 'write it as {"source": "gpt", "args": {"layers": 14}} (a zoo name or package.module:function)'
        if not isinstance(obj, dict) or not isinstance(obj.get("source"), str) or not obj["source"]:
            raise ModelSpecError(f"{where} must be an object with a 'source' string and 'args', got {obj!r}; {fix}")
        extra = set(obj) - {"source", "args"}
        if extra:
            raise ModelSpecError(f"{where} has unknown field {sorted(extra)[0]!r}; it takes 'source' and 'args'")
        args = obj.get("args") or {}
        if not isinstance(args, dict) or not all(isinstance(v, _ARG_TYPES) for v in args.values()):
            raise ModelSpecError(f"{where} has 'args' {args!r}; give an object of JSON scalars; {fix}")
        source = obj["source"]
        if ":" not in source and source not in ZOO_NAMES:
            raise ModelSpecError(f"{where} names {source!r}, which is no zoo model ({', '.join(ZOO_NAMES)}) "
                                 "and no package.module:function")  # fmt: skip
        return cls(source=source, args=dict(args), trusted=trust or source in ZOO_NAMES or source.startswith(HF_PREFIX))


def parse_arg(text: str) -> tuple[str, Any]:
    """``k=v`` with ints, floats and booleans auto-typed."""
    if "=" not in text:
        raise ModelSpecError(f"--arg {text!r} must look like KEY=VALUE, e.g. --arg layers=14")
    key, raw = text.split("=", 1)
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
    return key.strip(), value
