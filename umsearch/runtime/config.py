"""Settings of one ``umsearch run``."""

from __future__ import annotations

from dataclasses import dataclass

from umsearch.runtime.launch import LaunchConfig


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How many iterations to run, with which data, optimizer and processes."""

    steps: int = 5
    """Iterations (global batches) to run."""
    seed: int = 0
    """Seed of the model weights and of the batches (batch i uses seed * 1_000_003 + i)."""
    lr: float = 0.01
    """SGD learning rate."""
    collect_grads: bool = False
    """Return every parameter's gradient after the last iteration (for tests)."""
    launch: LaunchConfig = LaunchConfig()
    """Process start-up: backend, threads per rank, timeouts."""

    def batch_seed(self, step: int) -> int:
        """Seed of the generator that makes batch ``step`` (the same on every rank)."""
        return self.seed * 1_000_003 + step
