"""Settings of one ``umsearch run``: the single source of every default.

The ``run``/``validate`` options and the torchrun entry point
(:mod:`umsearch.runtime.torchrun`) both take their defaults from these
dataclasses, and :meth:`RunConfig.to_argv` writes a config back as the entry
point's flags, so a local run and a cluster run see the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How to start the stage processes."""

    backend: str = "gloo"
    """``gloo`` (CPU tensors) or ``nccl`` (one GPU per rank, ``cuda:LOCAL_RANK``)."""
    threads: int | None = 1
    """``torch.set_num_threads`` in each rank (and ``OMP_NUM_THREADS``); None leaves torch's default."""
    timeout_s: float = 300.0
    """Seconds a rank may wait for a peer (every process group, pipeline links included) before it fails."""
    run_timeout_s: float | None = None
    """Stop everything when the whole local run takes longer than this (None: no limit)."""
    pin_cores: bool = True
    """On CPU, pin each local rank to its own ``threads`` cores (``os.sched_setaffinity``) when the
    machine has enough of them, so that ranks do not migrate onto each other's cores."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How many iterations to run, with which data, optimizer and processes."""

    steps: int = 20
    """Iterations (global batches) to run."""
    warmup_steps: int = 2
    """Leading iterations left out of the reported median and spread (allocator, caches warming up)."""
    seed: int = 0
    """Seed of the model weights and of the batches (batch i uses seed * 1_000_003 + i)."""
    lr: float = 0.01
    """SGD learning rate."""
    check: bool = True
    """Refuse, before running, a plan that deadlocks or does not fit the model (in the launching
    process and again in every rank). Off only to test the runtime's own failure handling."""
    collect_grads: bool = False
    """Return every parameter's gradient after the last iteration (for tests)."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Process start-up: backend, threads per rank, timeouts."""

    def batch_seed(self, step: int) -> int:
        """Seed of the generator that makes batch ``step`` (the same on every rank)."""
        return self.seed * 1_000_003 + step

    def to_argv(self) -> list[str]:
        """This config as flags of ``python -m umsearch.runtime.torchrun`` (every value explicit)."""
        lc = self.launch
        argv = [f"--steps={self.steps}", f"--warmup-steps={self.warmup_steps}", f"--seed={self.seed}",
                f"--lr={self.lr!r}", f"--backend={lc.backend}", f"--threads={lc.threads or 0}",
                f"--timeout={lc.timeout_s!r}"]  # fmt: skip
        if not lc.pin_cores:
            argv.append("--no-pin-cores")
        return argv
