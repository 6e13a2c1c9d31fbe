"""A Hugging Face GPT-2 as umsearch pipeline layers (random weights, no download).

umsearch takes a user model as ``package.module:function``; ``function(**args)``
returns ``(layers, make_batch, loss)``. The module is looked up in the current
folder first, as ``python -m`` does, so run these from the repository root (the
folder that holds ``examples/``); ``tests/examples/test_hf_gpt2.py`` runs them as
written (short measurements, to keep it quick: drop ``--repeats`` and ``--rounds``
for a profile and a check you will rely on)::

    umsearch profile examples.hf_gpt2:build --arg layers=4 --sizes 1,2,4,8 --repeats 5 --out runs/gpt2/profile.json
    umsearch search --profile runs/gpt2/profile.json --ranks 2 --global-batch 16 --out runs/gpt2
    umsearch run runs/gpt2/plan.json --model examples.hf_gpt2:build --arg layers=4 --steps 3
    umsearch validate runs/gpt2/plan.json --model examples.hf_gpt2:build --arg layers=4 --rounds 3

Layer ``i`` of the pipeline is: ``0`` the token and position embeddings,
``1..layers`` the transformer blocks (``transformer.h.{i-1}`` in the Hugging
Face model), ``layers+1`` the final norm and the language-model head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from umsearch.nn.adapters import HiddenState


class Embeddings(nn.Module):
    """Token plus position embeddings: token ids ``(b, seq)`` -> hidden ``(b, seq, width)``."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding) -> None:
        super().__init__()
        self.wte, self.wpe = wte, wpe

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.wte(ids) + self.wpe(positions)


class Head(nn.Module):
    """Final layer norm and the language-model head: hidden -> logits ``(b, seq, vocab)``."""

    def __init__(self, ln_f: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


def build(layers: int = 4, width: int = 128, heads: int = 4, seq: int = 64, vocab: int = 1024,
          ) -> tuple[list[nn.Module], Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]],
                     Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:  # fmt: skip
    """GPT-2 with ``layers`` blocks, dropout off (so microbatched gradients equal full-batch ones)."""
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=seq, vocab_size=vocab,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    # The head shares the token embedding's weight in GPT-2; across stages on
    # different ranks a shared weight would need its own gradient all-reduce,
    # which the pipeline does not do, so the head gets its own copy.
    head = nn.Linear(width, vocab, bias=False)
    head.weight.data.copy_(model.transformer.wte.weight.data)
    t = model.transformer
    pipeline: list[nn.Module] = [Embeddings(t.wte, t.wpe)]
    pipeline += [HiddenState(block) for block in t.h]
    pipeline.append(Head(t.ln_f, head))

    def make_batch(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, vocab, (b, seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Mean over tokens of equal-length samples = mean over samples of their means.
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return pipeline, make_batch, loss
