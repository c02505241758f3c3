"""Remove two kinds of waste from generated ``torch.fx`` code (e3nn's tensor products).

e3nn builds its tensor products and linear layers as ``torch.fx`` graphs, and SevenNet
and MACE run them as they are.  Two patterns in that generated code cost an MLIP on a
CPU a good share of its step, and neither changes what the graph computes:

* **dead nodes**: outer products whose result no later node uses are still evaluated
  on every call (one per instruction of some paths);
* **many slices of one tensor**: the per-edge weights (and the inputs) are cut into one
  slice per instruction.  In the backward pass, which every force evaluation runs,
  each slice allocates and zero-fills a gradient of the *whole* tensor; a single
  ``torch.split`` into the same pieces has a backward that concatenates them once.

:func:`slim_graph_modules` rewrites every ``GraphModule`` inside a network in place.
Energies come out identical and gradients equal up to the order in which autograd adds
contributions (float round-off); the plugins' tests check both against the untouched
network.  TorchScript modules (e3nn before torch 2.10) and anything else are left alone.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch
from torch import fx

#: module prefixes of call targets that have no side effects unless they are in-place
_PURE_MODULES = ("torch", "_operator", "operator", "math")


def _is_impure(node: fx.Node) -> bool:
    """True unless ``node`` is a torch/operator call that writes nothing (conservative:
    in-place methods end in ``_``, an ``out=`` argument writes to an existing tensor)."""
    if node.op not in ("call_function", "call_method") or node.is_impure():
        return True
    if node.kwargs.get("out") is not None:
        return True
    if node.op == "call_method":
        name, module = str(node.target), "torch"
    else:
        name = getattr(node.target, "__name__", "")
        module = getattr(node.target, "__module__", None) or ""
    in_place = name.endswith("_") and not name.endswith("__")
    return in_place or not module.startswith(_PURE_MODULES)


def _dim_slice(index: Any) -> tuple[int, int, int] | None:
    """``(dim, start, stop)`` if ``index`` takes ``x[..., a:b]`` (dim -1) or
    ``x[:, a:b]`` (dim 1) with plain non-negative bounds, else None."""
    if not isinstance(index, tuple) or len(index) != 2:
        return None
    head, cut = index
    if head is Ellipsis:
        dim = -1
    elif head == slice(None):
        dim = 1
    else:
        return None
    if not isinstance(cut, slice) or cut.step not in (None, 1):
        return None
    start = 0 if cut.start is None else cut.start
    stop = cut.stop
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop):
        return None
    return dim, start, stop


def _slices_by_dim(node: fx.Node) -> dict[int, list[tuple[fx.Node, int, int]]]:
    out: dict[int, list[tuple[fx.Node, int, int]]] = {}
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            continue
        if user.args[0] is not node or (cut := _dim_slice(user.args[1])) is None:
            continue
        dim, start, stop = cut
        out.setdefault(dim, []).append((user, start, stop))
    return out


def _fuse_slices(graph: fx.Graph, node: fx.Node, dim: int, cuts: list) -> bool:
    """Replace the slices ``cuts`` of ``node`` along ``dim`` by one ``torch.split``
    (pieces between the cuts are split off and unused); False if they overlap."""
    spans = sorted({(start, stop) for _, start, stop in cuts})
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        return False
    bounds, piece_of = [0], {}
    for start, stop in spans:
        if start > bounds[-1]:
            bounds.append(start)
        piece_of[(start, stop)] = len(bounds) - 1
        bounds.append(stop)
    sizes: list[Any] = [b - a for a, b in itertools.pairwise(bounds)]
    with graph.inserting_after(node):
        width = graph.call_method("size", (node, dim))
    with graph.inserting_after(width):
        rest = graph.call_function(operator.sub, (width, bounds[-1]))
    with graph.inserting_after(rest):
        parts = graph.call_function(torch.split, (node, [*sizes, rest]), {"dim": dim})
    for user, start, stop in cuts:
        with graph.inserting_after(parts):
            piece = graph.call_function(operator.getitem, (parts, piece_of[(start, stop)]))
        user.replace_all_uses_with(piece)
        graph.erase_node(user)
    return True


def slim_graph(module: fx.GraphModule) -> bool:
    """Rewrite one GraphModule in place (see the module docstring); True if changed."""
    graph = module.graph
    changed = graph.eliminate_dead_code(is_impure_node=_is_impure)
    for node in list(graph.nodes):
        for dim, cuts in _slices_by_dim(node).items():
            if len(cuts) > 1:
                changed = _fuse_slices(graph, node, dim, cuts) or changed
    if changed:
        graph.lint()
        module.recompile()
    return changed


def slim_graph_modules(network: torch.nn.Module) -> int:
    """Apply :func:`slim_graph` to every ``fx.GraphModule`` in ``network``; returns how
    many were rewritten."""
    return sum(slim_graph(m) for m in network.modules() if isinstance(m, fx.GraphModule))


__all__ = ["slim_graph", "slim_graph_modules"]
