"""A backward pass split into its input-gradient part ``I`` and its weight-gradient part ``W``.

Zero-bubble schedules run the gradient a stage owes its predecessor first
(``I``) and the gradients of its own weights later (``W``), to fill bubbles.
The split only pays when ``I + W`` costs about what one full backward ``B``
does, so ``W`` must not redo any of ``I``'s work. Two plain
``torch.autograd.grad`` calls (inputs, then parameters) would: the second
walks back through every activation again.

How the split works here. The autograd graph of a stage divides into the
*input side*, the nodes through which the output's gradient reaches the
stage's inputs, and the rest, which leads only to parameters. ``I`` runs the
input side alone (``torch.autograd.grad`` on the inputs, graph kept), and on
the way records the gradient arriving at each input-side node that also feeds
the parameter side: these nodes are the *boundary*. ``W`` then starts a
second backward at the boundary nodes, seeded with the recorded gradients
(:class:`torch.autograd.graph.GradientEdge`), restricted to the parameters,
so it runs exactly the parameter side plus the boundary nodes' weight halves
(a ``Linear``'s ``addmm`` backward computes its input gradient in ``I`` and its
weight gradient in ``W``; neither is computed twice).

Parameters are grouped by the boundary nodes they hang from; each group is
one backward call, so that ``W`` never follows an input-side path from one
boundary node to another. Within one group (a parameter used at several
places along the input side) such a path can exist; the recorded gradient of
every boundary node then replaces whatever reaches it, so nothing counts
twice. A stage whose inputs need no gradient (the first stage) has no input
side: ``I`` does nothing and ``W`` is the whole backward.

The profiler measures ``I`` and ``W`` per layer with these same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

Grads = tuple[torch.Tensor | None, ...]
"""The gradients arriving at one autograd node, one per output of its forward (None: none arrived)."""


def _node(t: torch.Tensor) -> Node | None:
    """The autograd node that receives ``t``'s gradient: its ``grad_fn``, or a leaf's accumulator."""
    if not t.requires_grad:
        return None
    if t.grad_fn is not None:
        return t.grad_fn
    # A leaf's AccumulateGrad node is created lazily; a throwaway view makes it exist and shows it.
    view_fn = t.view_as(t).grad_fn
    assert view_fn is not None
    return view_fn.next_functions[0][0]


def _post_order(root: Node) -> list[tuple[Node, list[Node]]]:
    """Every node reachable from ``root`` with its children, each after all of its children."""
    seen: set[Node] = {root}
    order: list[tuple[Node, list[Node]]] = []
    stack: list[tuple[Node, list[Node], int]] = [(root, [n for n, _ in root.next_functions if n is not None], 0)]
    while stack:
        node, kids, i = stack[-1]
        while i < len(kids) and kids[i] in seen:
            i += 1
        if i == len(kids):
            stack.pop()
            order.append((node, kids))
            continue
        stack[-1] = (node, kids, i + 1)
        child = kids[i]
        seen.add(child)
        stack.append((child, [n for n, _ in child.next_functions if n is not None], 0))
    return order


@dataclass
class _Group:
    """Parameters that hang from the same boundary nodes: one backward call of ``W``."""

    seeds: list[Node] = field(default_factory=list)
    """Boundary nodes (their recorded gradients start ``W``)."""
    params: list[int] = field(default_factory=list)
    """Indices into :attr:`WeightWork.params`."""


@dataclass(eq=False)
class WeightWork:
    """What ``I`` leaves for ``W``: the boundary nodes, their recorded gradients, the parameters.

    Holding it keeps the parameter side of the graph (and its saved tensors)
    alive; :func:`backward_weight` consumes it.
    """

    params: list[torch.Tensor]
    """The parameters ``W`` accumulates into."""
    groups: list[_Group]
    """One backward call each."""
    grads: dict[Node, Grads] = field(default_factory=dict)
    """Gradient recorded at each boundary node during ``I`` (or the output's own, when ``W`` is all)."""
    done: bool = False
    """Set once :func:`backward_weight` has run."""


def _bits(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _group(hanging: list[tuple[Node, int]]) -> list[_Group]:
    """Boundary nodes that share a parameter (transitively) form one group (union-find on parameters)."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        parent.setdefault(i, i)
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: list[int] = []
    for _, mask in hanging:
        bits = _bits(mask)
        first.append(bits[0])
        for b in bits[1:]:
            parent[find(b)] = find(bits[0])
    groups: dict[int, _Group] = {}
    for (node, _), b in zip(hanging, first, strict=True):
        groups.setdefault(find(b), _Group()).seeds.append(node)
    for b in list(parent):
        groups[find(b)].params.append(b)
    for g in groups.values():
        g.params.sort()
    return list(groups.values())


def _plan_weight_work(root: Node, input_nodes: set[Node], params: Sequence[torch.Tensor]) -> tuple[WeightWork, bool]:
    """Split the graph below ``root`` into input side and parameter side and group the parameters;
    also says whether ``root`` is on the input side (whether ``I`` has anything to do).

    Linear in the graph; parameter sets are bit masks (this runs once per microbatch).
    """
    param_bit: dict[Node, int] = {}
    for index, param in enumerate(params):
        n = _node(param)
        if n is not None:
            param_bit[n] = 1 << index
    # Children first: whether a node reaches an input, and (off the input side) the parameters
    # below it. Off the input side is closed downwards: no child of such a node reaches an input.
    input_side: set[Node] = set()
    below: dict[Node, int] = {}
    hanging: list[tuple[Node, int]] = []  # boundary node, the parameters hanging from it
    for node, kids in _post_order(root):
        if node in input_nodes or any(c in input_side for c in kids):
            input_side.add(node)
            mask = 0
            for c in kids:
                if c not in input_side:
                    mask |= below[c]
            if mask:
                hanging.append((node, mask))
            continue
        mask = param_bit.get(node, 0)
        for c in kids:
            mask |= below[c]
        below[node] = mask
    reaches = root in input_side
    if not reaches:  # nothing reaches an input: W is the whole backward, started at the output
        hanging = [(root, below[root])] if below[root] else []
    groups = _group(hanging)
    return WeightWork(params=list(params), groups=groups), reaches


def _seed(output: torch.Tensor, grad_output: torch.Tensor | None) -> torch.Tensor:
    """The gradient that starts the backward: ``grad_output``, or 1 for a scalar loss."""
    if grad_output is not None:
        return grad_output
    if output.numel() != 1:
        raise ValueError(f"an output of shape {tuple(output.shape)} needs its grad_output (only a scalar loss may omit it)")
    return torch.ones_like(output)


def backward_input(
    output: torch.Tensor, grad_output: torch.Tensor | None, inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> tuple[Grads, WeightWork]:  # fmt: skip
    """``I``: the gradients of ``inputs``, and the work :func:`backward_weight` needs for ``params``.

    ``output`` (a stage's output with its ``grad_output``, or its scalar loss
    with ``grad_output`` None) was computed from ``inputs`` and ``params``.
    Returns one gradient per input (None where the input needs none or the
    output does not depend on it); no ``.grad`` is touched. The graph is kept
    for ``W``: drop your references to ``output`` afterwards, the
    :class:`WeightWork` holds what ``W`` needs.
    """
    result: list[torch.Tensor | None] = [None] * len(inputs)
    root = _node(output)
    if root is None:
        return tuple(result), WeightWork(params=list(params), groups=[])
    seed = _seed(output, grad_output)
    wanted = [i for i, x in enumerate(inputs) if x.requires_grad]
    input_nodes = {n for n in (_node(inputs[i]) for i in wanted) if n is not None}
    work, reaches = _plan_weight_work(root, input_nodes, params)
    if not reaches:
        if work.groups:
            work.grads[root] = (seed,)  # nothing reaches an input: W is the whole backward
        return tuple(result), work
    seeds = [n for g in work.groups for n in g.seeds]
    handles = [node.register_prehook(_recorder(work.grads, node)) for node in seeds]
    try:
        got = torch.autograd.grad(output, [inputs[i] for i in wanted], seed, retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    for i, g in zip(wanted, got, strict=True):
        result[i] = g
    return tuple(result), work


def _recorder(store: dict[Node, Grads], node: Node) -> Callable[[Grads], None]:
    def hook(grad_outputs: Grads) -> None:
        store[node] = tuple(grad_outputs)

    return hook


def _replacer(grads: Grads) -> Callable[[Grads], Grads]:
    def hook(_arriving: Grads) -> Grads:
        return grads

    return hook


def backward_weight(work: WeightWork) -> None:
    """``W``: accumulate the gradients of ``work.params`` into their ``.grad`` (once per work)."""
    if work.done:
        raise RuntimeError("backward_weight ran twice on the same WeightWork")
    work.done = True
    # Groups that may walk the input side between their seeds keep the graph for the others.
    for group in sorted(work.groups, key=lambda g: len(g.seeds) == 1):
        edges: list[GradientEdge] = []
        grads: list[torch.Tensor] = []
        for node in group.seeds:
            for i, g in enumerate(work.grads.get(node, ())):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(g)
        if not edges:
            continue  # no gradient reached this group's parameters
        params = [work.params[i] for i in group.params]
        several = len(group.seeds) > 1
        handles = [n.register_prehook(_replacer(work.grads[n])) for n in group.seeds if n in work.grads] if several else []
        try:
            torch.autograd.backward(edges, grads, inputs=params, retain_graph=several)
        finally:
            for h in handles:
                h.remove()
    work.grads.clear()
    work.groups.clear()


def backward_full(
    output: torch.Tensor, grad_output: torch.Tensor | None, inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> Grads:  # fmt: skip
    """``B``: one backward that accumulates into ``params``' ``.grad`` and returns ``inputs``' gradients.

    Arguments as for :func:`backward_input`. ``inputs`` that need a gradient
    must be leaves (a stage's detached inputs); their ``.grad`` is left as it was.
    """
    result: list[torch.Tensor | None] = [None] * len(inputs)
    if not output.requires_grad:
        return tuple(result)
    wanted = [i for i, x in enumerate(inputs) if x.requires_grad]
    for i in wanted:
        if inputs[i].grad_fn is not None:
            raise ValueError(f"input {i} is not a leaf; detach it and set requires_grad before the forward")
    targets = [inputs[i] for i in wanted] + [p for p in params if p.requires_grad]
    if not targets:
        return tuple(result)
    saved = [inputs[i].grad for i in wanted]
    for i in wanted:
        inputs[i].grad = None
    torch.autograd.backward(output, _seed(output, grad_output), inputs=targets)
    for i, old in zip(wanted, saved, strict=True):
        result[i] = inputs[i].grad
        inputs[i].grad = old
    return tuple(result)
