"""What a session plans once per kind of run: extra fetches built in its private graph.

The inf/nan watches (hidden_non_finite.py, non_finite_origin.py) each add, for a run of
some fetches fed some tensors, a few ops to the private graph and fetch their result with
the run.  ``RunPlans(shadow, plan)`` memoises ``plan(elements, fed)`` per such run, and
forgets them when a heal imports a new generation (new names);
``computed_by(elements, fed_names)`` is what both look at: the operations such a run
computes, and which of them lie inside TF1 control flow (their tensors cannot be fetched);
``packed_non_finite(graph, tensors, scope)`` is the one fetch both make: whether each tensor
holds inf/nan, as one bool vector; a ``Plan`` is what a watch planned: its kind, an entry
per tensor, and that vector.  In a training run both leave the backward pass out
(``in_backward_pass``): its inf/nan is the loss scale's concern.
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Sequence, Set, Tuple

import tensorflow as tf

from ..graph_rewrite.control_flow import control_flow_of, tf_graph_inputs
from .op_walks import ancestors
from .unscaled_training import GRADIENT_SCOPE

HIDDEN, ORIGIN = "hidden", "origin"  # Plan kinds: hidden_non_finite.py, non_finite_origin.py


class Plan(NamedTuple):
    """One run's extra fetch: whether each watched tensor holds inf/nan."""

    kind: str        # HIDDEN or ORIGIN
    entries: list    # per watched tensor: a Hidden (HIDDEN), an Origin (ORIGIN)
    statuses: tf.Tensor  # the packed bool vector (packed_non_finite)


class RunPlans:
    """``plan(elements, fed)`` per run of a rewriting session's private graph."""

    def __init__(self, shadow, plan: Callable):
        self.shadow = shadow
        self._plan = plan
        self._key = None
        self._planned: Dict[tuple, object] = {}

    def get(self, elements: Sequence, fed=()):
        """The plan for a run of ``elements`` (private graph) fed ``fed``, made once -- under
        the private graph's lock: threads sharing a session (Hogwild workers) plan their
        first runs at once, and walking a graph's consumers while another thread adds ops to
        it fails inside TensorFlow."""
        with self.shadow.lock:
            key = self.shadow.private_name("")
            if key != self._key:  # a heal imported a new generation
                self._key = key
                self._planned.clear()
            run = run_key(elements, fed)
            if run not in self._planned:
                self._planned[run] = self._plan(elements, fed)
            return self._planned[run]


def run_key(elements: Sequence, fed=()) -> tuple:
    """What tells a run apart: the names of what it fetches (``elements``) and feeds."""
    return tuple(getattr(e, "name", str(e)) for e in elements), tuple(sorted(t.name for t in fed))


def computed_by(elements: Sequence, fed_names=frozenset()) -> Tuple[List, Set]:
    """``(operations, inside)``: the operations a run of ``elements`` computes (a tensor in
    ``fed_names`` is fed), sorted by name so that plans come out alike in every process, and
    those among them inside a TF1 while loop or cond branch."""
    operations = sorted(ancestors(elements, fed_names), key=lambda op: op.name)
    inside = {operations[i] for i in control_flow_of(*tf_graph_inputs(operations))}
    return operations, inside


def packed_non_finite(graph, tensors: Sequence, scope: str) -> tf.Tensor:
    """A bool vector in ``graph``, under top-level ``scope``: whether each of ``tensors``
    holds inf/nan (each reduction beside its tensor)."""
    statuses = []
    with graph.as_default(), tf.compat.v1.name_scope(None), tf.compat.v1.name_scope(scope):
        for tensor in tensors:
            with graph.colocate_with(tensor.op, ignore_existing=True):
                if tensor.shape.num_elements() == 0:
                    # nothing to check -- and the value may not be what the shape says: a
                    # fused batch norm's gradient says (0,) of its reserve outputs and returns
                    # scalars on the CPU, which a reduction over axis 0 fails on
                    statuses.append(tf.constant(False))
                    continue
                values = tf.cast(tensor, tf.float32) if tensor.dtype == tf.bfloat16 else tensor
                statuses.append(tf.reduce_any(tf.logical_not(tf.math.is_finite(values))))
        return tf.stack(statuses)


def in_backward_pass(shadow, op) -> bool:
    """Whether private-graph ``op`` belongs to a backward pass (``gradients/`` scopes)."""
    return bool(GRADIENT_SCOPE.search(shadow.user_name(op.name)))
