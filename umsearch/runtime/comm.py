"""Point-to-point links between ranks over ``torch.distributed``: one process group per directed pair.

A rank may hold several stages, so one pair of ranks can carry activations
and gradients of several stage boundaries in both directions (interleaved,
rank 0 -> rank 1 carries stage 0 -> 1 and stage 2 -> 3 activations and the
stage 2 -> 1 gradients). Every directed pair ``(src, dst)`` that carries a
message gets its own group, on which ``src`` only sends and ``dst`` only
receives. With NCCL, which ignores tags and matches a group's messages in the
order they are issued, each such group is its own communicator and stream:
the receiver posts its receives in exactly the order the sender sends (the
executor derives both from the plan), and a receive posted early on one link
never queues behind a send on another. With gloo the groups are separate
channels and tags (unique per message) match them as well.

With data-parallel replicas (docs/model.md section 9) every replica has its own
links among its own processes: ``replicas[d][r]`` is the world rank of
replica ``d``'s pipeline rank ``r``; a rank speaks of its peers by pipeline
rank and :class:`RankComm` sends to their world ranks.

Every group gets the link timeout (by default the default group's), so a rank
waiting on a message that never comes fails after ``--timeout`` seconds
instead of torch's 30-minute default. :meth:`RankComm.create` ends with one
small message on every link, in the same order on every rank: it connects
NCCL's lazily created point-to-point communicators in an order that cannot
deadlock (one rank initialising a link while its peer waits on another
would), and proves every link before the first iteration.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from umsearch.core.plan import Plan
from umsearch.errors import RuntimeExecutionError

Link = tuple[int, int]
"""``(src, dst)``: a directed pair of ranks."""


class Handle(Protocol):
    """A pending send or receive (``torch.distributed`` work objects are handles)."""

    def wait(self) -> object: ...
    def is_completed(self) -> bool: ...


class Comm(Protocol):
    """What a :class:`~umsearch.runtime.executor.StageExecutor` needs to talk to the other ranks."""

    @property
    def device(self) -> torch.device: ...
    def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> Handle: ...
    def irecv(self, src: int, buffer: torch.Tensor, tag: int) -> Handle: ...
    def barrier(self) -> None: ...


def plan_links(plan: Plan) -> tuple[Link, ...]:
    """Every directed pair of ranks that carries a message of ``plan``, sorted (the same on every rank)."""
    links: set[Link] = set()
    for a, b in zip(plan.stages, plan.stages[1:], strict=False):
        if a.rank != b.rank:
            links.add((a.rank, b.rank))  # activations
            links.add((b.rank, a.rank))  # gradients
    return tuple(sorted(links))


class RankComm:
    """The links of one rank: a process group per directed pair of ranks that exchanges messages."""

    def __init__(self, *, rank: int, groups: dict[Link, dist.ProcessGroup], device: torch.device,
                 world: Sequence[int] | None = None) -> None:  # fmt: skip
        self.rank = rank
        self._groups = groups
        self._device = device
        self._world = tuple(world) if world is not None else None  # pipeline rank -> world rank

    @classmethod
    def create(cls, links: Sequence[Link], device: torch.device, timeout: timedelta | None = None, *,
               replicas: Sequence[Sequence[int]] | None = None) -> RankComm:  # fmt: skip
        """Build one group per link (per replica); every process of the default group must call this with
        the same ``links`` and ``replicas``.

        ``timeout`` bounds every wait on a link (default: the default group's
        timeout, as given to ``init_process_group``). ``replicas[d][r]``: the
        world rank of replica ``d``'s pipeline rank ``r`` (default: one
        replica, pipeline rank = world rank); links name pipeline ranks.
        """
        if not dist.is_initialized():
            raise RuntimeExecutionError(
                "torch.distributed is not initialised; call init_process_group first (umsearch run does it for you)"
            )
        me, world = dist.get_rank(), dist.get_world_size()
        maps = [tuple(m) for m in replicas] if replicas is not None else [tuple(range(world))]
        ranks = len(maps[0])
        bad = [link for link in links if link[0] == link[1] or not all(0 <= r < ranks for r in link)]
        if bad:
            raise RuntimeExecutionError(f"link {bad[0]} is not a pair of distinct ranks among the {ranks} of a replica")
        mine = next((m for m in maps if me in m), None)
        if mine is None:
            raise RuntimeExecutionError(f"process {me} is in none of the replicas {maps}")
        timeout = timeout if timeout is not None else default_group_timeout()
        groups: dict[Link, dist.ProcessGroup] = {}
        for m in maps:
            for link in sorted(set(links)):
                # new_group is collective over the default group: every process creates every group. It
                # does not inherit the default group's timeout, hence the explicit one.
                group = dist.new_group(sorted(m[r] for r in link), timeout=timeout)
                if m is mine and mine.index(me) in link:
                    assert group is not None
                    groups[link] = group
        comm = cls(rank=mine.index(me), groups=groups, device=device, world=mine)
        comm._connect(sorted(set(links)))
        return comm

    def _world_rank(self, rank: int) -> int:
        return self._world[rank] if self._world is not None else rank

    def _connect(self, links: Sequence[Link]) -> None:
        """One blocking message per link of this rank, in the global order of ``links``."""
        probe = torch.zeros(1, device=self._device)
        for src, dst in links:
            if self.rank == src:
                work = self.isend(dst, probe, _CONNECT_TAG)
            elif self.rank == dst:
                work = self.irecv(src, probe, _CONNECT_TAG)
            else:
                continue
            try:
                work.wait()
            except RuntimeError as exc:
                raise RuntimeExecutionError(
                    f"rank {self.rank} could not connect the link rank {src} -> rank {dst}: {first_line(exc)}"
                ) from None

    @property
    def device(self) -> torch.device:
        return self._device

    def _group(self, link: Link) -> dist.ProcessGroup:
        group = self._groups.get(link)
        if group is None:
            raise RuntimeExecutionError(f"rank {self.rank} has no link rank {link[0]} -> rank {link[1]}")
        return group

    def isend(self, dst: int, tensor: torch.Tensor, tag: int) -> Handle:
        """Start sending ``tensor`` to (pipeline) rank ``dst`` on the link ``(me, dst)``."""
        work = dist.isend(tensor, dst=self._world_rank(dst), group=self._group((self.rank, dst)), tag=tag)
        assert work is not None
        return work

    def irecv(self, src: int, buffer: torch.Tensor, tag: int) -> Handle:
        """Start receiving into ``buffer`` from (pipeline) rank ``src`` on the link ``(src, me)``."""
        work = dist.irecv(buffer, src=self._world_rank(src), group=self._group((src, self.rank)), tag=tag)
        assert work is not None
        return work

    def barrier(self) -> None:
        """Wait for every process (the default group: every rank of every replica) to get here."""
        if self._device.type == "cuda":
            dist.barrier(device_ids=[self._device.index or 0])
        else:
            dist.barrier()


_CONNECT_TAG = 0x7FFF_FFFF
"""Tag of the connecting message (message tags stay below it; see :func:`umsearch.runtime.executor.tag`)."""


def first_line(exc: BaseException) -> str:
    """An exception's first line, without gloo's ``[path/file.cc:line]`` prefix."""
    lines = str(exc).strip().splitlines()
    return re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else type(exc).__name__


def default_group_timeout() -> timedelta | None:
    """The timeout the default group was initialised with; None (torch's default) if unknown."""
    try:
        group = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
        timeout = group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError, ValueError):  # private API: tolerate its absence
        return None
    return timeout if isinstance(timeout, timedelta) else None
