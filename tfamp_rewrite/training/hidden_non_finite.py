"""Inf/nan that a run's fetched values cannot show.

A run that computes no loss-scaled step has no step watch, so the session looks at what it
returns (session.py).  Some fetched values hide an inf/nan computed upstream: ``argmax`` of
NaN logits is an ordinary index, a comparison with NaN is ``False``, a NaN cast to an
integer is some integer, and the accuracy of such predictions is an ordinary number.  A
classifier or greedy decoder whose half logits overflowed then returns plausible-looking
garbage, and so does a ratio whose denominator overflowed (SSIM of 0..255 images is 0).
``HiddenNonFinite.fetches(elements, fed)`` plans, for such a run, one small extra fetch:
for each floating tensor that an op hiding inf/nan reads (``HIDING_OPS``) and that a half
node lies upstream of, whether it holds inf/nan -- packed into one bool vector.
Tensors inside a TF1 while loop or cond branch are left out: they cannot be fetched there.

A training run whose steps apply can hide one too: a loss of ``1 - ssim`` on 0..255 images
is 1 with zero gradients.  ``HiddenNonFinite(shadow, forward_only=True)`` plans for such
runs, and watches the forward pass only: a backward node's inf/nan is the loss scale's
concern (the step skips), and a gradient's division hides nothing the loss shows.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

from .op_walks import reachable
from .python_backprop import PYTHON_OPS
from .run_plans import HIDDEN, Plan, RunPlans, computed_by, in_backward_pass, packed_non_finite
from .state_guard import WRITE_OPS, value_input

# Op type -> the inputs whose inf/nan its outputs do not show; also a Cast from a floating
# type to another (_hidden_inputs).
HIDING_OPS = {
    "ArgMax": (0,), "ArgMin": (0,), "TopKV2": (0,), "TopK": (0,), "InTopK": (0,), "InTopKV2": (0,),
    "Equal": (0, 1), "NotEqual": (0, 1), "Less": (0, 1), "LessEqual": (0, 1),
    "Greater": (0, 1), "GreaterEqual": (0, 1), "ApproximateEqual": (0, 1),
    # A CTC decoder of NaN logits returns ordinary-looking (or empty) transcripts.
    "CTCGreedyDecoder": (0,), "CTCBeamSearchDecoder": (0,),
    # Dividing by inf gives 0: SSIM on 0..255 images, whose smoothed x^2 + y^2 overflows
    # float16 in a depthwise convolution, comes out 0 (a normalisation, a variance below it).
    "RealDiv": (1,), "Div": (1,), "DivNoNan": (1,), "Reciprocal": (0,), "Inv": (0,),
    # A clip turns -inf into its bound: squared distances as |a|^2 + |b|^2 - 2ab, clipped at
    # 0 (metric learning's pairwise distances), are 0 where the half Gram matrix overflowed.
    "Maximum": (0, 1), "Minimum": (0, 1), "ClipByValue": (0,),
    # A hand-written update (EM's M-step, k-means' centroids, a stored covariance) keeps an
    # overflow in its variable, unseen until later runs read it back.
    **{write: (value_input(write),) for write in WRITE_OPS},
}
_SCOPE = "tfamp_hidden_non_finite"


class HiddenNonFinite:
    """A rewriting session's checks of the inf/nan its runs' fetched values hide."""

    def __init__(self, shadow, forward_only: bool = False):
        self.shadow = shadow
        self.forward_only = forward_only
        self._plans = RunPlans(shadow, self._plan)

    def fetches(self, elements: Sequence, fed=()) -> Optional[Plan]:
        """A ``HIDDEN`` plan for a run of ``elements`` (private graph): a ``Hidden`` per
        watched tensor (as text "'logits:0', read by 'ArgMax' (ArgMax)"), the packed status
        true where it holds inf/nan; None when the run computes no such tensor."""
        return self._plans.get(elements, fed)

    def _in_backward_pass(self, op) -> bool:
        return self.forward_only and in_backward_pass(self.shadow, op)

    def _plan(self, elements, fed):
        fed_names = {t.name for t in fed}
        operations, inside = computed_by(elements, fed_names)
        computed = set(operations)
        half_downstream = reachable(
            [op for op in computed if self.shadow.computes_in_half(op)],
            lambda op: [c for t in op.outputs for c in t.consumers() if c in computed])
        watched = {}
        for op in operations:
            if self._in_backward_pass(op):
                continue
            for index in _hidden_inputs(op):
                tensor = op.inputs[index]
                if (tensor.dtype.is_floating and tensor.op in half_downstream
                        and not self._in_backward_pass(tensor.op) and tensor.name not in fed_names
                        and tensor.name not in watched and tensor.op not in inside):
                    watched[tensor.name] = (tensor, op)
        if not watched:
            return None
        user = self.shadow.user_name
        entries = [Hidden(user(self.shadow.user_source(tensor).name), user(reader.name), reader.type)
                   for tensor, reader in watched.values()]
        return Plan(HIDDEN, entries, packed_non_finite(
            self.shadow.graph, [t for t, _ in watched.values()], _SCOPE))


class Hidden(NamedTuple):
    """A watched tensor (user graph names) and the op whose outputs do not show its inf/nan;
    as text, how a notice names it."""

    tensor: str
    reader: str
    reader_op: str

    def __str__(self) -> str:
        return "%r, read by %r (%s)" % (self.tensor, self.reader, self.reader_op)


def _hidden_inputs(op) -> Tuple[int, ...]:
    """The inputs of ``op`` whose inf/nan its outputs do not show: Python code (a metric,
    hard-example mining) may turn them into anything."""
    if op.type in PYTHON_OPS:
        return tuple(i for i, tensor in enumerate(op.inputs) if tensor.dtype.is_floating)
    if op.type == "Cast":
        return (0,) if op.inputs[0].dtype.is_floating and not op.outputs[0].dtype.is_floating else ()
    return HIDING_OPS.get(op.type, ())
