"""Any Hugging Face causal language model as pipeline layers, from its config alone: ``hf:NAME``.

``NAME`` is a ``model_type`` transformers knows (``llama``, ``mistral``,
``qwen2``, ``qwen3``, ``gemma``, ``phi3``, ``gpt2``, ...) or a local folder
holding a ``config.json``. The arguments override config fields
(``num_hidden_layers=8``, ``hidden_size=512``, ``vocab_size=1024``), except two
one of umsearch's own: ``seq`` (tokens per sample, default
:data:`DEFAULT_SEQ`). Nothing is downloaded: the weights are random (fixed by
the builder's seed), every dropout is off (so microbatched gradients equal
the full batch's) and attention runs through PyTorch's SDPA.

These models share one shape, and the split follows it: layer 0 the token
embeddings (plus learned positions, GPT-2; times sqrt(width), Gemma), one layer
per decoder layer, the last the final norm and the language-model head. A
decoder layer computes what it needs from the hidden state it receives, on
whichever rank runs it: positions, the rotary embeddings, and the causal
mask (SDPA's own, or a sliding-window one where the model has a window shorter
than the sequence). A model of another shape is refused in one line naming
what is missing.

Tied input and output embeddings (GPT-2, Gemma, small Llamas) stay tied: the
first and the last layer hold the same parameter, marked with both layers
(:func:`~umsearch.nn.tied.mark_tied`), so that the runtime sums its
gradient across the ranks of the two stages that hold it
(:mod:`umsearch.runtime.tied`); on one rank autograd adds the two uses.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from umsearch.core.model_spec import HF_PREFIX
from umsearch.errors import ModelSpecError
from umsearch.nn.adapters import HiddenState
from umsearch.nn.spec import BuiltModel
from umsearch.nn.tied import mark_tied

DEFAULT_SEQ = 128
"""Tokens per sample unless ``seq`` says otherwise."""
MAX_SEQ = 1 << 17
_LAYER_LISTS = ("layers", "h", "blocks")
_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm")
_SCALED_EMBEDDINGS = ("gemma", "gemma2")
"""Model types whose token embeddings are multiplied by sqrt(hidden_size): in the base model's forward in older
transformers, by the embedding module itself (its ``embed_scale``) in newer ones."""


def _config(name: str, overrides: dict[str, Any]) -> tuple[Any, bool]:
    """The config with ``overrides`` and every dropout off; and whether the model ties its embeddings."""
    from transformers import AutoConfig

    if not name:
        raise ModelSpecError("hf: needs a model type or a folder, e.g. --model hf:llama or hf:./my-model")
    from transformers.utils import logging as hf_logging

    folder = Path(name)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # special tokens outside a smaller vocab are warned about: set right below
    try:
        if (folder / "config.json").is_file():
            config = AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True, **overrides)
        elif os.sep in name or name.startswith("."):
            raise ModelSpecError(f"hf:{name}: the folder has no config.json; give a folder with the model's "
                                 "config.json or a model type such as hf:llama")  # fmt: skip
        else:
            config = AutoConfig.for_model(name, **overrides)
    except ValueError as exc:  # an unknown model type
        raise ModelSpecError(f"hf:{name}: {str(exc).splitlines()[0]}; give a model type transformers knows "
                             "(llama, mistral, qwen2, qwen3, gemma, phi3, gpt2, ...)") from None  # fmt: skip
    finally:
        hf_logging.set_verbosity(level)
    # A config keeps unknown keywords as attributes: compare with its class's fields and their aliases.
    known = {*type(config)().to_dict(), *getattr(config, "attribute_map", {})}
    unknown = sorted(k for k in overrides if k not in known)
    if unknown:
        raise ModelSpecError(f"hf:{name} has no config field {unknown[0]!r}; --arg takes the config's fields "
                             "(num_hidden_layers, hidden_size, vocab_size, ...) and seq")  # fmt: skip
    for key, value in config.to_dict().items():  # every dropout off: microbatches must give the batch's gradients
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(config, key, 0.0)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # a smaller vocab than the model's default
        token = getattr(config, key, None)
        if isinstance(token, int) and not 0 <= token < config.vocab_size:
            setattr(config, key, None)
    config.use_cache = False
    return config, bool(getattr(config, "tie_word_embeddings", False))


def _first(owner: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    for n in names:
        m = getattr(owner, n, None)
        if isinstance(m, nn.Module):
            return n, m
    return None


class Embeddings(nn.Module):
    """Token ids ``(b, seq)`` to hidden states: the token embedding, times ``scale``, plus learned positions."""

    def __init__(self, tokens: nn.Module, positions: nn.Module | None, scale: float) -> None:
        super().__init__()
        self.tokens, self.positions, self.scale = tokens, positions, scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(ids)
        if self.scale != 1.0:
            hidden = hidden * torch.tensor(self.scale, dtype=hidden.dtype)
        if self.positions is not None:
            hidden = hidden + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return hidden


class Head(nn.Module):
    """Final norm and the language-model head: hidden states to logits ``(b, seq, vocab)``."""

    def __init__(self, norm: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden))


def _accepts(layer: nn.Module) -> Callable[[str], bool]:
    """Whether the layer's forward takes a keyword (any, when it takes ``**kwargs``)."""
    params = inspect.signature(layer.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return lambda name: True
    return lambda name: name in params


def _layer_kwargs(layer: nn.Module, rotary: nn.Module | None,
                  window: int | None) -> Callable[[torch.Tensor], dict[str, Any]]:  # fmt: skip
    """What a decoder layer needs beside its hidden state, computed from it where the layer runs."""
    takes = _accepts(layer)

    def make(hidden: torch.Tensor) -> dict[str, Any]:
        b, seq = hidden.shape[0], hidden.shape[1]
        positions = torch.arange(seq, device=hidden.device).unsqueeze(0).expand(b, seq)
        extra: dict[str, Any] = {"position_ids": positions, "attention_mask": None}
        if rotary is not None:
            extra["position_embeddings"] = rotary(hidden, positions)
        if window is not None and seq > window:
            i = torch.arange(seq, device=hidden.device)
            allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
            extra["attention_mask"] = allowed[None, None].expand(b, 1, seq, seq)
        return {k: v for k, v in extra.items() if takes(k)}

    return make


def build_hf(source: str, args: dict[str, Any]) -> BuiltModel:
    """``hf:NAME`` with config overrides ``args`` (and ``seq``), split as the module docstring says."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ModelSpecError(f"{source} needs the transformers package: pip install 'umsearch[hf]'") from None

    name = source[len(HF_PREFIX):]
    overrides = dict(args)
    seq = overrides.pop("seq", DEFAULT_SEQ)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ:
        raise ModelSpecError(f"{source}: seq={seq!r} must be an integer from 1 to {MAX_SEQ}")
    config, tied = _config(name, overrides)
    _check_size(source, config)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError as exc:
        raise ModelSpecError(f"{source}: {str(exc).splitlines()[0]}; it must be a causal language model") from None
    built = _split(source, model, config, seq)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if tied and head.weight is not embed.weight:
        raise ModelSpecError(f"{source}: the config ties the input and output embeddings but "
                             f"{type(model).__name__} built them apart; untie them with --arg tie_word_embeddings=false")
    if head.weight is embed.weight:
        mark_tied(head.weight, (0, len(built.layers) - 1))
    return built


def _available_bytes() -> float:
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return float("inf")


def _check_size(source: str, config: Any) -> None:
    """Refuse, before any weight is made, a model whose weights alone would not fit in memory (a model
    type's default size is its full-size model: hf:llama is 7 billion parameters)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shape = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    weights = sum(p.numel() * p.element_size() for p in shape.parameters())
    free = _available_bytes()
    if 2 * weights > free:  # the weights, and as much again while they are initialised and cut
        count = sum(p.numel() for p in shape.parameters())
        raise ModelSpecError(f"{source} has {count / 1e9:.2f} billion parameters ({weights / 2**30:.1f} GiB of "
                             f"weights), more than half the {free / 2**30:.1f} GiB of memory free here; give "
                             "smaller sizes, e.g. --arg num_hidden_layers=4 --arg hidden_size=512")  # fmt: skip


def _split(source: str, model: Any, config: Any, seq: int) -> BuiltModel:
    prefix = getattr(model, "base_model_prefix", "model")
    base = getattr(model, prefix, None)
    if not isinstance(base, nn.Module):
        raise ModelSpecError(f"{source}: no base model under {prefix!r}")
    embed, head = base.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[operator]
    layer_list, final_norm = _first(base, _LAYER_LISTS), _first(base, _NORMS)
    found = {"input embeddings": embed, "output embeddings": head, "decoder layer list": layer_list,
             "final norm": final_norm}  # fmt: skip
    missing = [what for what, m in found.items() if m is None]
    if missing or layer_list is None or final_norm is None:
        raise ModelSpecError(f"{source} ({type(model).__name__}) does not have the shape of a causal LM that "
                             f"umsearch splits: no {', '.join(missing)}")  # fmt: skip
    (list_name, layer_module), (norm_name, norm) = layer_list, final_norm
    layers = list(layer_module.children())
    positions = getattr(base, "wpe", None)
    rotary = getattr(base, "rotary_emb", None)
    # Newer transformers scale inside the embedding module (its embed_scale); older ones in the model's forward.
    outside = config.model_type in _SCALED_EMBEDDINGS and not hasattr(embed, "embed_scale")
    scale = float(config.hidden_size) ** 0.5 if outside else 1.0
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    pipeline: list[nn.Module] = [Embeddings(embed, positions, scale)]
    pipeline += [HiddenState(layer, make_kwargs=_layer_kwargs(layer, rotary, window)) for layer in layers]
    pipeline.append(Head(norm, head))
    names = [f"{prefix}.embed", *(f"{prefix}.{list_name}.{i}" for i in range(len(layers))),
             f"{prefix}.{norm_name}+lm_head"]  # fmt: skip
    vocab = int(config.vocab_size)

    def make_batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, vocab, (b, seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Every sample has seq tokens: the mean over tokens is the mean over samples of their means.
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    return BuiltModel(pipeline, names, make_batch, loss)
