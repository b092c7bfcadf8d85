"""What each loss-scaled training step tells: the scale it used and whether it was applied.

``LossScaleOptimizer.apply_gradients`` registers one ``StepSignal`` per train op it builds,
in a list held by the graph itself: the signals' tensors hold their graph, so a registry
keyed by graph, even weakly, would keep every graph alive (a hyperparameter sweep building
a graph per trial grew by each one); graph and list form a cycle the collector frees.  Sessions fetch the two
tensors alongside every run that computes them anyway -- the step's own finite flag and its
loss scale as read before the step's update -- so watching the steps costs two scalars per
step and no extra computation (``skip_guard``).

Each signal is also described, by its tensors' names and its loss scale's parameters, in
the graph's ``COLLECTION``, which a MetaGraph carries: a training run resumed with
``import_meta_graph`` rebuilds its signals from there (``step_signals``), so its skipped
steps are watched as the run that built the graph watched them.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

_SIGNALS = "_tfamp_step_signals"  # the graph's attribute holding its signals
COLLECTION = "tfamp_rewrite_step_signals"  # their descriptions, carried by a MetaGraph
_lock = threading.Lock()


@dataclass(frozen=True)
class StepSignal:
    """One train op's finite flag and the loss scale its step used (tensors of the user graph)."""

    all_finite: object      # bool scalar tensor
    scale: object           # float32 scalar tensor, read before the step updates the scale
    loss_scale: object      # the LossScale (its initial value, minimum, multiplier)
    should_apply: object = None  # the skip cond's predicate (a bool tensor), or None (fixed scale)
    # A step built inside the user's TF1 tf.cond (gradients accumulated, applied every N-th
    # run): its flag and scale cannot be fetched, so they are also passed out of the cond
    # (``outside_tf1_conds``) as float32 scalars -- the flag 1/0, both NOT_RUN when the branch
    # was not taken -- and ``computed_by``, an op of the step, tells which runs compute it.
    exported: Optional[tuple] = None  # (flag, scale) outside the conds, or None
    computed_by: object = None
    variables: Tuple[str, ...] = ()  # the names of the variables the step updates
    # Whether the loss the step's gradients came from was finite (a bool scalar), or None
    # (gradients from elsewhere, or a step in the user's TF1 cond): a skipped step whose
    # loss is itself inf/nan needs no fall of the scale to be diagnosed (skip_guard).
    loss_finite: object = None


NOT_RUN = -1.0  # an exported flag's and scale's value when the step's branch was not taken


def register(graph, signal: StepSignal) -> None:
    with _lock:
        signals = _signals_of(graph)
        signals.append(signal)
        described = _described(signal)
        if described is not None:
            graph.add_to_collection(COLLECTION, described)


def has_step_signals(graph) -> bool:
    """Whether ``graph`` has a loss-scaled train op (no lock: its answer only grows)."""
    return bool(getattr(graph, _SIGNALS, None)) or bool(graph.get_collection(COLLECTION))


def loss_scale_variables(signals) -> list:
    """The variables of ``signals``' loss scales, each once, in order (steps may share one)."""
    found = {}
    for signal in signals:
        for variable in signal.loss_scale.variables():
            found.setdefault(id(variable), variable)
    return list(found.values())


def step_signals(graph) -> List[StepSignal]:
    """The StepSignals of ``graph``'s loss-scaled train ops, in the order they were built
    (those of a graph imported with its MetaGraph rebuilt from their descriptions)."""
    with _lock:
        return list(_signals_of(graph))


def _signals_of(graph) -> list:
    """The graph's list of signals, made on first use: from the descriptions its collection
    holds, where it was imported with them (called with ``_lock`` held)."""
    signals = getattr(graph, _SIGNALS, None)
    if signals is None:
        rebuilt = (_rebuilt(graph, described) for described in graph.get_collection(COLLECTION))
        signals = [signal for signal in rebuilt if signal is not None]
        setattr(graph, _SIGNALS, signals)
    return signals


def _described(signal: StepSignal) -> Optional[str]:
    """``signal`` as JSON: its tensors' and ops' names, its loss scale's kind, parameters and
    variables' names; None for a loss scale of another kind."""
    scale = signal.loss_scale
    if hasattr(scale, "min_loss_scale"):
        described_scale = dict(kind="dynamic", variables=[v.name for v in scale.variables()],
                               initial=scale.initial_loss_scale, period=scale.increment_period,
                               multiplier=scale.multiplier, min=scale.min_loss_scale)
    elif hasattr(scale, "value"):
        described_scale = dict(kind="fixed", value=scale.value)
    else:
        return None

    def name(element):
        return None if element is None else element.name

    return json.dumps(dict(
        all_finite=name(signal.all_finite), scale=name(signal.scale), loss_scale=described_scale,
        should_apply=name(signal.should_apply), computed_by=name(signal.computed_by),
        exported=None if signal.exported is None else [name(t) for t in signal.exported],
        variables=list(signal.variables), loss_finite=name(signal.loss_finite)))


def _rebuilt(graph, text) -> Optional[StepSignal]:
    """The StepSignal ``text`` (a ``_described`` JSON) describes in ``graph``, or None where
    its elements are not there (a graph imported under another scope)."""
    from . import loss_scale as loss_scale_module

    try:
        described = json.loads(text.decode() if isinstance(text, bytes) else text)

        def element(name):
            return None if name is None else graph.as_graph_element(name)

        scale = described["loss_scale"]
        if scale["kind"] == "fixed":
            loss_scale = loss_scale_module.FixedLossScale(scale["value"])
        else:
            by_name = {v.name: v for v in graph.get_collection("variables")}
            loss_scale = loss_scale_module.ImportedDynamicLossScale(
                [by_name[n] for n in scale["variables"]], scale["initial"], scale["period"],
                scale["multiplier"], scale["min"])
        return StepSignal(
            all_finite=element(described["all_finite"]), scale=element(described["scale"]),
            loss_scale=loss_scale, should_apply=element(described["should_apply"]),
            exported=(None if described["exported"] is None
                      else tuple(element(n) for n in described["exported"])),
            computed_by=element(described["computed_by"]), variables=tuple(described["variables"]),
            loss_finite=element(described["loss_finite"]))
    except (KeyError, ValueError, TypeError):
        return None


def in_loss_scaled_apply(op) -> bool:
    """Whether ``op`` (user graph) lies in the apply branch of a loss-scaled step's TF1 cond
    (whose predicate is the step's ``should_apply``; a TF1 cond's context holds an Identity
    of it)."""
    predicates = {s.should_apply.name for s in step_signals(op.graph) if s.should_apply is not None}
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    while context is not None:
        predicate = getattr(context, "pred", None)
        if predicate is not None and predicates & {predicate.name, predicate.op.inputs[0].name
                                                   if predicate.op.inputs else ""}:
            return True
        context = getattr(context, "outer_context", None)
    return False


def outside_tf1_conds(tensors: Sequence) -> Optional[list]:
    """``tensors`` (scalars built now, inside the user's TF1 cond branches) as float32
    tensors outside every enclosing cond: at each level a Merge of the value with NOT_RUN,
    which flows when the branch is not taken.  None when no TF1 cond encloses them, or a
    while loop does (a loop's iterations cannot be passed out as one value)."""
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    here = graph._get_control_flow_context()  # pylint: disable=protected-access
    conds, context = [], here
    while context is not None:
        if getattr(context, "pred", None) is None or not hasattr(context, "branch"):
            return None  # a while loop
        conds.append(context)
        context = context.outer_context
    if not conds:
        return None
    values = [tf.cast(t, tf.float32) for t in tensors]
    try:
        for cond in conds:  # innermost first
            graph._set_control_flow_context(cond.outer_context)  # pylint: disable=protected-access
            not_taken = 1 - cond.branch  # Switch's outputs: (false branch, true branch)
            values = [tf.raw_ops.Merge(inputs=[value, tf.raw_ops.Switch(
                data=tf.constant(NOT_RUN), pred=cond.pred)[not_taken]])[0] for value in values]
    finally:
        graph._set_control_flow_context(here)  # pylint: disable=protected-access
    return values


def in_skip_cond(op) -> bool:
    """True if ``op`` was built inside a TF1 cond that skips a loss-scaled step of its graph
    (a cond_v2 builds its branches in functions, outside the graph's operations)."""
    predicates = {s.should_apply.name for s in step_signals(op.graph) if s.should_apply is not None}
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    while context is not None:
        pred = getattr(context, "pred", None)  # TF1's cond holds Identity(pred), "cond/pred_id"
        if pred is not None and (pred.name in predicates or (
                pred.op.type == "Identity" and pred.op.inputs[0].name in predicates)):
            return True
        context = context.outer_context
    return False
