"""Point-to-point links between a stage and its neighbours over ``torch.distributed``.

Each boundary has two process groups, one per direction (activations forward,
gradients backward). With NCCL every group is its own communicator and CUDA
stream, so receives posted early in one direction can never queue behind a
send in the other; with gloo the groups are just separate channels. Within a
direction both sides issue messages in message order; gloo additionally
matches them by tag (the message index).

Every group gets the run's timeout (by default the default group's), so a
rank waiting on a message that never comes fails after ``--timeout`` seconds
instead of torch's 30-minute default.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal, Protocol

import torch
import torch.distributed as dist

from umsearch.core.errors import RuntimeExecutionError

Peer = Literal["prev", "next"]


class Handle(Protocol):
    """A pending send or receive (``torch.distributed`` work objects are handles)."""

    def wait(self) -> object: ...
    def is_completed(self) -> bool: ...


class Comm(Protocol):
    """What a :class:`~umsearch.runtime.executor.StageExecutor` needs to talk to its neighbours."""

    @property
    def device(self) -> torch.device: ...
    def isend(self, peer: Peer, tensor: torch.Tensor, tag: int) -> Handle: ...
    def irecv(self, peer: Peer, buffer: torch.Tensor, tag: int) -> Handle: ...
    def barrier(self) -> None: ...


class StageComm:
    """The links of one stage in a pipeline that runs one rank per stage."""

    def __init__(
        self,
        *,
        stage: int,
        ranks: Sequence[int],
        forward_groups: Sequence[dist.ProcessGroup | None],
        backward_groups: Sequence[dist.ProcessGroup | None],
        device: torch.device,
    ) -> None:
        self.stage = stage
        self.ranks = tuple(ranks)
        self._fwd = list(forward_groups)  # _fwd[s]: activations s -> s+1
        self._bwd = list(backward_groups)  # _bwd[s]: gradients s+1 -> s
        self._device = device

    @classmethod
    def create(cls, num_stages: int, device: torch.device, ranks: Sequence[int] | None = None,
               timeout: timedelta | None = None) -> StageComm:  # fmt: skip
        """Build the per-boundary groups; every rank of the default group must call this alike.

        ``ranks[s]`` is the global rank running stage ``s`` (default: rank s).
        ``timeout`` bounds every wait on a link (default: the default group's
        timeout, as given to ``init_process_group``).
        """
        if not dist.is_initialized():
            raise RuntimeExecutionError(
                "torch.distributed is not initialised; call init_process_group first "
                "(umsearch run does it for you)"
            )
        ranks = list(range(num_stages)) if ranks is None else list(ranks)
        if len(ranks) != num_stages or len(set(ranks)) != num_stages:
            raise RuntimeExecutionError(f"need {num_stages} distinct ranks for the stages, got {ranks}")
        me = dist.get_rank()
        if me not in ranks:
            raise RuntimeExecutionError(f"rank {me} runs no stage of {ranks}")
        timeout = timeout if timeout is not None else default_group_timeout()
        fwd: list[dist.ProcessGroup | None] = []
        bwd: list[dist.ProcessGroup | None] = []
        for s in range(num_stages - 1):
            pair = [ranks[s], ranks[s + 1]]
            # new_group is collective over the default group: every rank creates every group.
            # It does not inherit the default group's timeout, hence the explicit one.
            to_next = dist.new_group(pair, timeout=timeout)
            to_prev = dist.new_group(pair, timeout=timeout)
            fwd.append(to_next if me in pair else None)
            bwd.append(to_prev if me in pair else None)
        return cls(stage=ranks.index(me), ranks=ranks, forward_groups=fwd, backward_groups=bwd,
                   device=device)  # fmt: skip

    @property
    def device(self) -> torch.device:
        return self._device

    def _route(self, peer: Peer, sending: bool) -> tuple[int, dist.ProcessGroup]:
        s = self.stage
        if peer == "next":
            other = s + 1
            group = None if other >= len(self.ranks) else (self._fwd[s] if sending else self._bwd[s])
        else:
            other = s - 1
            group = None if other < 0 else (self._bwd[other] if sending else self._fwd[other])
        if group is None:
            raise RuntimeExecutionError(f"stage {s} has no {peer} stage to talk to")
        return self.ranks[other], group

    def isend(self, peer: Peer, tensor: torch.Tensor, tag: int) -> Handle:
        """Start sending ``tensor`` (activations to ``next``, gradients to ``prev``)."""
        rank, group = self._route(peer, sending=True)
        work = dist.isend(tensor, dst=rank, group=group, tag=tag)
        assert work is not None
        return work

    def irecv(self, peer: Peer, buffer: torch.Tensor, tag: int) -> Handle:
        """Start receiving into ``buffer`` (activations from ``prev``, gradients from ``next``)."""
        rank, group = self._route(peer, sending=False)
        work = dist.irecv(buffer, src=rank, group=group, tag=tag)
        assert work is not None
        return work

    def barrier(self) -> None:
        """Wait for every stage (the default group) to get here."""
        if self._device.type == "cuda":
            dist.barrier(device_ids=[self._device.index or 0])
        else:
            dist.barrier()


def default_group_timeout() -> timedelta | None:
    """The timeout the default group was initialised with; None (torch's default) if unknown."""
    try:
        group = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
        timeout = group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError, ValueError):  # private API: tolerate its absence
        return None
    return timeout if isinstance(timeout, timedelta) else None
