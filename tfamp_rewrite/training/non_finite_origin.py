"""Where the inf/nan of a run with no loss-scaled step starts.

A run that computes no loss-scaled step is not re-run (input pipelines, ``py_func``), so
when one returns or hides inf/nan the session says so at once (inference_watch.py) and
looks for the origin on the next such runs: ``NonFiniteOrigin.fetches(elements, fed)``
plans one extra fetch, whether each tensor of the run's half region holds inf/nan, packed
in one bool vector, producers before consumers.  The half region is the nodes that compute
in half and the nodes the rewrite added (casts, emulation's rounding); its tensors are
their floating outputs and the float32 values they read.  The first tensor holding
inf/nan is the origin (``first``, ``Origin``):

    a half node's output                      it overflowed: keep it float32
    an added node's, its source a half node   its output overflowed when rounded to half
    an added node's, its source float32       a float32 value past half's range, cast for
                                              the half nodes reading it: keep those float32
    a float32 or fed value                    it held inf/nan already: float16 did not cause it

Tensors inside a TF1 while loop or cond branch are left out: they cannot be fetched there.
In a training run (``NonFiniteOrigin(shadow, forward_only=True)``) the backward pass is
left out too: a gradient's inf/nan there is the loss scale's (the step skips, the scale
falls), not where an inf/nan the run returned starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import tensorflow as tf

from ..graph_rewrite.control_flow import producers_first, tf_graph_inputs
from ..graph_rewrite.emulation import VALUE_PRESERVING_OPS
from .run_plans import ORIGIN, Plan, RunPlans, computed_by, in_backward_pass, packed_non_finite
from .shadow_graph import has_operation

_SCOPE = "tfamp_non_finite_origin"
HALF, ADDED, FLOAT32, FED = "half", "added", "float32", "fed"


@dataclass
class Origin:
    """One watched tensor, in the user graph's names (for an added node's, its source's)."""

    tensor: str
    kind: str                  # HALF, ADDED, FLOAT32 or FED (module docstring)
    node: str                  # its node; for ADDED, the user's node the added ones read
    op: str                    # that node's op type
    source_half: bool = False  # ADDED: whether that node computes in half
    readers: List[str] = field(default_factory=list)  # ADDED: the half user nodes reading it
    inputs: List[int] = field(default_factory=list)   # the watched tensors its node reads

    def nodes_to_keep(self) -> List[str]:
        """The user's nodes that keeping float32 would avoid it (none: float16 is not the cause)."""
        if self.kind == HALF or (self.kind == ADDED and self.source_half):
            return [self.node]
        return list(self.readers) if self.kind == ADDED else []


class NonFiniteOrigin:
    """A rewriting session's search for the first tensor holding inf/nan in a run."""

    def __init__(self, shadow, forward_only: bool = False):
        self.shadow = shadow
        self.forward_only = forward_only
        self._plans = RunPlans(shadow, self._plan)

    def fetches(self, elements, fed=()) -> Optional[Plan]:
        """An ``ORIGIN`` plan for a run of ``elements`` (private graph): an Origin per watched
        tensor, the packed status true where it holds inf/nan; None when the run computes no
        half node."""
        return self._plans.get(elements, fed)

    @staticmethod
    def first(watched: List[Origin], statuses) -> Optional[Origin]:
        """The first watched tensor holding inf/nan (producers come first), or None."""
        for each, status in zip(watched, statuses):
            if status:
                return each
        return None

    @staticmethod
    def independent(watched: List[Origin], statuses) -> List[Origin]:
        """Every watched tensor holding inf/nan whose node reads no watched tensor holding
        any: where an inf/nan starts, not where another's flows (the Gram matrices of five
        style layers, each overflowing on its own)."""
        return [each for each, status in zip(watched, statuses)
                if status and not any(statuses[i] for i in each.inputs)]

    def _plan(self, elements, fed):
        fed_names = {t.name for t in fed}
        operations, inside = computed_by(elements, fed_names)
        user_graph, user = self.shadow.user_graph, self.shadow.user_name
        order = [operations[i] for i in producers_first(*tf_graph_inputs(operations))
                 if operations[i] not in inside
                 and not (self.forward_only and in_backward_pass(self.shadow, operations[i]))]
        half = {op for op in order if self.shadow.computes_in_half(op)}
        added = {op for op in order if not has_operation(user_graph, user(op.name))}
        if not half:
            return None
        region = half | added
        tensors: Dict[str, tf.Tensor] = {}
        for tensor in [t for t in fed if t.dtype.is_floating] + [
                t for op in order for t in op.outputs if t.dtype.is_floating]:
            if tensor.name not in tensors and (tensor.op in region or any(
                    c in region for c in tensor.consumers())):
                tensors[tensor.name] = tensor
        if not tensors:  # half nodes with no floating value (an argmax)
            return None
        watched = [self._origin(t, fed_names, half, added) for t in tensors.values()]
        index = {name: i for i, name in enumerate(tensors)}
        upstream = _WatchedUpstream(index, set(operations))
        for each, tensor in zip(watched, tensors.values()):
            if each.kind != FED:
                each.inputs = sorted({i for t in tensor.op.inputs for i in upstream.of(t)})
        return Plan(ORIGIN, watched, packed_non_finite(self.shadow.graph, list(tensors.values()), _SCOPE))

    def _origin(self, tensor, fed_names, half, added) -> Origin:
        user = self.shadow.user_name
        if tensor.name in fed_names:
            return Origin(user(tensor.name), FED, user(tensor.op.name), tensor.op.type)
        if tensor.op not in added:
            return Origin(user(tensor.name), HALF if tensor.op in half else FLOAT32,
                          user(tensor.op.name), tensor.op.type)
        source = self.shadow.user_source(tensor)
        return Origin(user(source.name), ADDED, user(source.op.name), source.op.type,
                      source.op in half, _half_readers(tensor, half, added, user))


class _WatchedUpstream:
    """The watched tensors nearest upstream of a tensor, past ones not watched that the run
    computes: a TF1 cond's Merge reads its branches, which cannot be watched, and the inf/nan
    they carry from a watched MatMul above is that MatMul's, not the Merge's own."""

    def __init__(self, index: Dict[str, int], computed):
        self.index, self.computed = index, computed
        self._memo: Dict[object, frozenset] = {}

    def of(self, tensor) -> frozenset:
        if tensor.name in self.index:
            return frozenset([self.index[tensor.name]])
        if tensor.op not in self.computed:
            return frozenset()
        return self._of_op(tensor.op)

    def _of_op(self, op) -> frozenset:
        known = self._memo.get(op)
        if known is not None:
            return known
        self._memo[op] = frozenset()  # a cycle (a loop's back edge) adds nothing
        stack, seen, found = [op], {op}, set()
        while stack:  # iterative: a long chain of unwatched ops must not recurse
            current = stack.pop()
            for tensor in current.inputs:
                if tensor.name in self.index:
                    found.add(self.index[tensor.name])
                elif tensor.op in self.computed and tensor.op not in seen:
                    if tensor.op in self._memo:
                        found |= self._memo[tensor.op]
                    else:
                        seen.add(tensor.op)
                        stack.append(tensor.op)
        self._memo[op] = frozenset(found)
        return self._memo[op]


def _half_readers(tensor, half, added, user) -> List[str]:
    """The user's half nodes reading ``tensor``, through nodes the rewrite added; past half
    nodes that only move values (a Reshape) to those that compute with them too, as keeping
    the mover float32 alone would only move the cast."""
    readers, stack, seen = [], [tensor], set()
    while stack:
        for consumer in stack.pop().consumers():
            if consumer in seen:
                continue
            seen.add(consumer)
            if consumer in added:
                stack.extend(consumer.outputs)
            elif consumer in half:
                readers.append(user(consumer.name))
                if consumer.type in VALUE_PRESERVING_OPS:
                    stack.extend(consumer.outputs)
    return readers
