"""Gradients accumulated over runs, then applied by a loss-scaled step in a run of its own.

The TF1 recipe: ``accum.assign_add(g)`` in each micro-batch run, then
``apply_gradients([(accum / n, w)])`` every n-th run.  Such an accumulator must keep an
overflowed gradient's inf/nan, so that the applying step's finite check sees it, skips and
lowers the scale: the state guard leaves it alone (shadow_graph.py), its writes are no
unguarded update (unscaled_training.py), and the runs filling it are no inference
(inference_watch.py).  An accumulator is a variable that a step's finite flag reads short of
any backward pass (a ``gradients`` name scope, where a step computing its own gradients
gets them), filled, outside every step's apply branch and by a write the step's own run
does not make, with values a backward pass computed, not only through a reduction.

Not accumulators, so guarded state: a momentum the program keeps by hand, written from the
gradients of the step that reads it (the step skips on its gradients, the momentum keeps
its value), and a running average of the gradients' norm, which a clip threshold reads (a
statistic, which the state guard keeps finite, as float32 has it).
"""
from __future__ import annotations

from typing import Dict

from ..doctor.probes import in_backward_scope
from .op_walks import ancestors, downstream_of, reachable
from .state_guard import PASSING, WRITE_OPS, value_input
from .step_signals import step_signals
from .variable_check import VARIABLE_OPS


def gradient_accumulators(graph) -> set:
    """The names of ``graph``'s gradient accumulators (module docstring)."""
    return set(_accumulation(graph).values())


def gradient_accumulation_writes(graph) -> set:
    """The names of ``graph``'s operations filling a gradient accumulator."""
    return set(_accumulation(graph))


def _accumulation(graph) -> Dict[str, str]:
    """``{write op name: accumulator name}``."""
    flags = [s.all_finite.op for s in step_signals(graph) if s.all_finite.graph is graph]
    read, seen, stack = set(), set(), list(flags)
    while stack:
        op = stack.pop()
        if op in seen or in_backward_scope(op.name):
            continue
        seen.add(op)
        if op.type in VARIABLE_OPS:
            read.add(op.name)
            continue
        stack.extend(t.op for t in op.inputs)
    if not read:
        return {}
    applied = downstream_of(graph, flags)
    # a write the flag waits on runs with the step: a momentum kept by hand, not an
    # accumulator (only a skipped step's own write would carry its inf over)
    same_run = ancestors(flags)
    writes = {}
    for op in graph.get_operations():
        if op.type not in WRITE_OPS or not op.inputs or op in applied or op in same_run:
            continue
        source = op.inputs[0].op
        while source.type in PASSING and source.inputs:
            source = source.inputs[0].op
        computed_from = reachable([op.inputs[value_input(op.type)].op], _inputs_short_of_reductions)
        if source.name in read and any(in_backward_scope(each.name) for each in computed_from):
            writes[op.name] = source.name
    return writes


# Ops that reduce a tensor to a statistic of it (a norm, a mean, a maximum).
_REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "L2Loss", "EuclideanNorm", "Norm"})


def _inputs_short_of_reductions(op):
    """What ``op`` is computed from, short of a reduction: a gradient's values reach an
    accumulator element by element, its norm only through one."""
    return [] if op.type in _REDUCTIONS else [t.op for t in op.inputs]
