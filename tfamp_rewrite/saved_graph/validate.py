"""Runs the original and the converted saved graph on the same inputs and compares outputs.

``validate(original, converted_path, io, ...) -> ValidationReport`` loads each graph with
TensorFlow's own loaders (``import_graph_def``; ``import_meta_graph`` and the checkpoint
beside the .meta, or the original's initial values copied over; SavedModel ``loader.load``),
feeds the same inputs (``--input-data`` .npz, else random with a fixed seed; unknown
dimensions take ``batch_size``) and compares every output in float64::

    max_abs_error  = max |c - o|           over elements finite in both
    max_rel_error  = max |c - o| / |o|     over those with |o| > atol (None: there are none)
    top1_agreement = mean(argmax(c, -1) == argmax(o, -1))   (floating outputs of rank >= 2 only)
    passed         = all |c - o| <= atol + rtol * |o|, and no finite o became inf/nan in c

Each graph is also timed (best of ``timed_runs`` runs after a warm-up).

How the converted graph computes its half nodes (``validation_numerics``): on a GPU with
its half kernels (``native``); without a GPU, by default, ``emulate`` -- float32 kernels on
values rounded to half at every half tensor, what a Tensor Core GPU computes, the same on
every CPU (graph_rewrite/emulation.py).  A CPU's own half kernels (``native`` without a GPU)
accumulate differently per CPU and are far slower, hence their looser default tolerance.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ..errors import ConversionError
from ..graph_rewrite.graph_view import parse_input
from .formats import GRAPHDEF, METAGRAPH, SavedGraph
from .graph_io import GraphIO, GraphTensor
from .plain_session import plain_session

NUMERICS_CHOICES = ("auto", "emulate", "native")
# Default rtol = atol by (numerics, dtype).  Emulated, as on a Tensor Core GPU: float16
# keeps 11 significant bits and a deep network drifts a few roundings further.  Measured
# on a frozen ResNet-50 calibrated like a trained one (tests/support/saved_graph_models.py:
# logits 11-15), random inputs of batch 8 seed 0 and batch 16 seeds 0-2, max abs error on
# its probabilities, top-1 agreement 100% throughout:
#   emulated float16 0.0012-0.0035, bfloat16 0.021-0.053;
#   native (this CPU's half kernels) float16 0.003-0.004 (AVX-512; AVX2 only: 0.003-0.006),
#   bfloat16 0.020-0.053.
# Every other --validate of the test suite needs <= 1e-3 in float16; of 1000 random graphs
# of the CLI property test, 1% need 1e-2 to 2e-2: a MatMul's cancelling sum scaled by 1e5,
# whose half rounding error is that share of the output.  (Before calibration,
# with batch norms that let its logits reach +-230, the same network measured 0.0075-0.012
# emulated and 0.01-0.12 native in float16, 0.05-0.30 in bfloat16: rounding such logits to
# float16 alone moves the softmax by 0.006-0.022, which the old float16 default 2e-2 allowed.)
# Native half kernels may accumulate in half, differently per CPU and batch size: their
# defaults keep a margin for CPUs not measured here.
DEFAULT_TOLERANCE = {
    ("emulate", "float16"): 1e-2, ("emulate", "bfloat16"): 1e-1,
    ("native", "float16"): 5e-2, ("native", "bfloat16"): 1e-1,
}


def validation_numerics(choice: str = "auto"):
    """``(numerics, why)``: how validation runs the converted graph's half nodes."""
    if choice not in NUMERICS_CHOICES:
        raise ConversionError("--numerics %s is not one of %s" % (choice, ", ".join(NUMERICS_CHOICES)),
                              "Pass --numerics emulate or --numerics native")
    if choice != "auto":
        return choice, "as asked (--numerics %s)" % choice
    import tensorflow as tf

    if tf.config.experimental.list_physical_devices("GPU"):
        return "native", "a GPU is visible: its half kernels run"
    return "emulate", ("no GPU is visible: float32 kernels on values rounded to half, as a Tensor Core "
                       "GPU computes")


@dataclass
class OutputComparison:
    """How one output of the converted graph compares with the original's."""

    name: str
    dtype: str
    converted_dtype: str
    max_abs_error: Optional[float]   # None: the shapes differ
    max_rel_error: Optional[float]   # None: no element of the original exceeds atol, or shapes differ
    top1_agreement: Optional[float]  # None: not a floating output of rank >= 2
    nonfinite: int               # finite in the original, inf/nan in the converted graph
    passed: bool
    shapes: Optional[str] = None     # "original -> converted" when they differ (a threshold the
                                     # converted values fell on the other side of: NMS, boolean_mask)


@dataclass
class ValidationReport:
    """The comparison of every output, the tolerances and the inference times."""

    rtol: float
    atol: float
    inputs: str                  # "random normal (seed 0, batch 4)" or the .npz path
    numerics: str = "native"     # how the converted graph's half nodes ran: native / emulate
    numerics_reason: str = ""
    passed: bool = True
    outputs: List[OutputComparison] = field(default_factory=list)
    seconds_original: float = 0.0
    seconds_converted: float = 0.0

    def summary_lines(self) -> List[str]:
        # The criterion is numpy's allclose: a row may pass with its max abs error above atol
        # and its max rel error above rtol, as long as no single element exceeds both.
        lines = ["Validation on %s: %s (every element within atol + rtol x |original|; rtol=%g, "
                 "atol=%g)" % (self.inputs, "passed" if self.passed else "FAILED", self.rtol, self.atol)]
        lines.append("  converted graph's half nodes ran %s (%s)" % (
            "emulated" if self.numerics == "emulate" else "native half kernels", self.numerics_reason))
        lines.append("  %-28s %-9s %12s %12s %8s %s" % ("output", "dtype", "max abs err", "max rel err",
                                                     "top-1", ""))
        for out in self.outputs:
            verdict = ("shape %s: no tolerance covers it" % out.shapes if out.shapes else
                       ("ok" if out.passed else "beyond tolerance") + (
                           ", %d non-finite" % out.nonfinite if out.nonfinite else ""))
            lines.append("  %-28s %-9s %12s %12s %8s %s" % (
                out.name, out.converted_dtype,
                "-" if out.max_abs_error is None else "%.3g" % out.max_abs_error,
                "-" if out.max_rel_error is None else "%.3g" % out.max_rel_error,
                "-" if out.top1_agreement is None else "%.1f%%" % (100 * out.top1_agreement), verdict))
        lines.append("  inference: original %.2f ms, converted %.2f ms (best run, this machine)" % (
            1e3 * self.seconds_original, 1e3 * self.seconds_converted))
        return lines


class Validator:
    """Compares converted graphs with ``original`` on the same inputs; the original runs once."""

    def __init__(self, original: SavedGraph, io: GraphIO, rtol: float, atol: float,
                 input_data: Optional[str] = None, batch_size: int = 4, seed: int = 0, timed_runs: int = 3):
        self.original, self.io, self.rtol, self.atol, self.timed_runs = original, io, rtol, atol, timed_runs
        self.feeds = (load_input_data(input_data, io.inputs) if input_data
                      else random_inputs(io.inputs, batch_size, seed))
        self.inputs = input_data or "random inputs (seed %d, %s)" % (
            seed, "unknown dimensions = %d" % batch_size)
        self.initial_values: Dict[str, np.ndarray] = {}  # MetaGraph variables without a checkpoint
        self._expected = None

    def expected(self):
        """``(outputs, best seconds)`` of the original graph (run on first use)."""
        if self._expected is None:
            self._expected = _run(self.original, self.original.path, self.original.text, self.io, self.feeds,
                                  self.timed_runs, self.initial_values)
        return self._expected

    def check(self, converted_path: str, converted_text: bool = False,
              timed_runs: Optional[int] = None, io: Optional[GraphIO] = None) -> ValidationReport:
        """The ValidationReport of the converted graph at ``converted_path`` (same format;
        ``io``: that conversion's inputs and outputs, for their converted dtypes)."""
        before, seconds_original = self.expected()
        report = ValidationReport(rtol=self.rtol, atol=self.atol, inputs=self.inputs,
                                  seconds_original=seconds_original)
        after, report.seconds_converted = _run(
            self.original, converted_path, converted_text, self.io, self.feeds,
            self.timed_runs if timed_runs is None else timed_runs, self.initial_values)
        for tensor, expected, actual in zip((io or self.io).outputs, before, after):
            comparison = compare(tensor.key, expected, actual, self.rtol, self.atol)
            comparison.converted_dtype = tensor.converted_dtype or comparison.converted_dtype
            report.outputs.append(comparison)
            report.passed = report.passed and comparison.passed
        return report


def validate(original: SavedGraph, converted_path: str, io: GraphIO, rtol: float, atol: float,
             input_data: Optional[str] = None, batch_size: int = 4, seed: int = 0,
             timed_runs: int = 3, converted_text: bool = False) -> ValidationReport:
    """Compares ``original`` with the converted graph at ``converted_path`` (same format;
    ``converted_text``: a converted GraphDef is in text format)."""
    return Validator(original, io, rtol, atol, input_data, batch_size, seed, timed_runs).check(
        converted_path, converted_text)


def compare(name: str, expected, actual, rtol: float, atol: float) -> OutputComparison:
    """One OutputComparison (see module docstring)."""
    original, converted = np.asarray(expected), np.asarray(actual)
    a, b = original.astype(np.float64), converted.astype(np.float64)
    if a.shape != b.shape:
        return OutputComparison(name, str(original.dtype), str(converted.dtype), None, None, None, 0,
                                False, shapes="%s -> %s" % (a.shape, b.shape))
    finite = np.isfinite(a)
    nonfinite = int(np.count_nonzero(finite & ~np.isfinite(b)))
    both = finite & np.isfinite(b)  # errors over values finite in both; the rest is ``nonfinite``
    diff = np.where(both, np.abs(b - a), 0.0)
    large = both & (np.abs(a) > atol)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff[large] / np.abs(a[large])).max()) if large.any() else None
    top1 = None
    if a.ndim >= 2 and a.shape[-1] > 1 and a.size and np.issubdtype(original.dtype, np.floating):
        top1 = float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))
    passed = nonfinite == 0 and bool(np.all(diff <= atol + rtol * np.abs(np.where(finite, a, 0.0))))
    return OutputComparison(name, str(original.dtype), str(converted.dtype), max_abs, max_rel, top1,
                            nonfinite, passed)


def random_inputs(inputs: List[GraphTensor], batch_size: int, seed: int) -> List[np.ndarray]:
    """One random array per input: normal floats, 0/1 integers, random booleans."""
    rng = np.random.default_rng(seed)
    arrays = []
    for tensor in inputs:
        if tensor.shape is None:
            raise ConversionError("input %r has an unknown rank, so no random value can be made for it"
                                  % tensor.key, "Pass its values with --input-data FILE.npz")
        shape = [batch_size if d is None else d for d in tensor.shape]
        if tensor.dtype.startswith(("float", "bfloat")):
            arrays.append(rng.standard_normal(shape).astype(np.float32))
        elif tensor.dtype.startswith(("int", "uint")):
            arrays.append(rng.integers(0, 2, shape).astype(tensor.dtype))
        elif tensor.dtype == "bool":
            arrays.append(rng.random(shape) < 0.5)
        else:
            raise ConversionError("input %r is %s, which has no random values" % (tensor.key, tensor.dtype),
                                  "Pass its values with --input-data FILE.npz")
    return arrays


def load_input_data(path: str, inputs: List[GraphTensor]) -> List[np.ndarray]:
    """The arrays of ``path`` (.npz) for each input, keyed by signature key, tensor or node name."""
    try:
        with np.load(path) as archive:
            data = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise ConversionError("cannot read --input-data %s (%s)" % (path, error),
                              "Pass a .npz file written by numpy.savez with one array per input") from None
    arrays = []
    for tensor in inputs:
        for key in (tensor.key, tensor.tensor, parse_input(tensor.tensor)[0]):
            if key in data:
                arrays.append(data[key])
                break
        else:
            raise ConversionError("--input-data %s has no array for input %r (it has %s)" % (
                path, tensor.key, ", ".join(sorted(data)) or "none"),
                "Add one named %r to the .npz" % tensor.key)
    return arrays


@contextlib.contextmanager
def loaded_graph(saved: SavedGraph, path: str, text: bool, io: GraphIO, initial_values):
    """Loads the graph at ``path`` as ``saved.kind`` into a plain session.

    Yields ``(session, {"inputs": [tensor names], "outputs": [tensor names]})``; variables
    are restored (or initialised as ``_restore_variables`` says).
    """
    import tensorflow as tf

    graph = tf.compat.v1.Graph()
    which = _which(saved, path)
    with graph.as_default(), plain_session(graph) as session:
        try:
            tensors = _load(saved, path, text, session, io, initial_values)
        except (tf.compat.v1.errors.OpError, ValueError) as error:
            raise ConversionError("the %s graph does not load for validation here: %s" % (
                which, op_error_text(error)),
                "Validation loads it with this process's TensorFlow and its ops; drop --validate") from None
        yield session, tensors


def _deprecation_notices_silenced():
    from tensorflow.python.util import deprecation

    silence = getattr(deprecation, "silence", None)
    return silence() if silence is not None else contextlib.nullcontext()


def _which(saved: SavedGraph, path: str) -> str:
    """"original" or "converted": which graph ``path`` holds, for messages."""
    return "original" if path == saved.path else "converted"


def op_error_text(error) -> str:
    """The line of a TensorFlow error that says what went wrong, shortened: TensorFlow 2's
    messages open with "Graph execution error:" and the Python trace of the failing node."""
    message = getattr(error, "message", None) or str(error)
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not line.startswith((" ", "\t"))]
    told = [line for line in lines
            if not line.startswith(("Graph execution error", "Detected at node", "Node: "))]
    text = (told or lines or [type(error).__name__])[0]
    return text if len(text) <= 300 else text[:297] + "..."


def input_feed(session, tensors: Dict[str, List[str]], values) -> dict:
    """The feed dict of ``values`` for the loaded graph's inputs, in their dtypes."""
    feed_dict = {}
    for tensor_name, value in zip(tensors["inputs"], values):
        dtype = session.graph.get_tensor_by_name(tensor_name).dtype.as_numpy_dtype
        feed_dict[tensor_name] = np.asarray(value).astype(dtype)
    return feed_dict


def _run(saved: SavedGraph, path: str, text: bool, io: GraphIO, feeds, timed_runs: int, initial_values):
    """Loads the graph at ``path`` as ``saved.kind``; returns (outputs, best seconds)."""
    import tensorflow as tf

    which = _which(saved, path)
    with loaded_graph(saved, path, text, io, initial_values) as (session, tensors):
        feed_dict = input_feed(session, tensors, feeds)
        for name, value in feed_dict.items():
            wanted = session.graph.get_tensor_by_name(name).shape
            if not wanted.is_compatible_with(value.shape):
                raise ConversionError("input %s takes shape %s; the validation inputs have %s" % (
                    name, wanted, list(value.shape)),
                    "Give --input-data arrays of that shape (or --batch-size for random inputs)")
        fetches = tensors["outputs"]
        try:
            outputs = session.run(fetches, feed_dict)
            best = float("inf") if timed_runs else 0.0
            for _ in range(timed_runs):
                start = time.perf_counter()
                session.run(fetches, feed_dict)
                best = min(best, time.perf_counter() - start)
        except tf.compat.v1.errors.OpError as error:
            fix = ("Validation runs it in this process, on this machine's CPU: drop --validate"
                   if which == "original" else
                   "Validation runs on this machine's CPU; drop --validate, or convert with --target cpu "
                   "(its half nodes then use kernels CPUs have)")
            raise ConversionError("the %s graph failed to run: %s" % (which, op_error_text(error)),
                                  fix) from None
    # bfloat16 outputs come back as a numpy extension type: compare them as float32
    outputs = [np.asarray(value) for value in outputs]
    return [value.astype(np.float32) if value.dtype.name == "bfloat16" else value for value in outputs], best


def _load(saved: SavedGraph, path: str, text: bool, session, io: GraphIO,
          initial_values) -> Dict[str, List[str]]:
    """Loads into ``session``'s graph; returns the input and output tensor names."""
    import tensorflow as tf

    if saved.kind == GRAPHDEF:
        from .formats import read_graph_file

        tf.compat.v1.import_graph_def(read_graph_file(path, text), name="")
    elif saved.kind == METAGRAPH:
        saver = tf.compat.v1.train.import_meta_graph(path)
        _restore_variables(saved, session, saver, initial_values)
    else:
        with _deprecation_notices_silenced():  # TF 2's loader logs three lines on stderr
            meta = tf.compat.v1.saved_model.loader.load(session, list(saved.tags), path)
        signature = meta.signature_def[io.signature]
        return {"inputs": [signature.inputs[t.key].name for t in io.inputs],
                "outputs": [signature.outputs[t.key].name for t in io.outputs]}
    return {"inputs": [t.tensor for t in io.inputs], "outputs": [t.tensor for t in io.outputs]}


def _restore_variables(saved: SavedGraph, session, saver, initial_values: Dict[str, np.ndarray]) -> None:
    """Restores the checkpoint beside the .meta; else initialises the variables, the first run
    recording their values in ``initial_values`` and later runs loading them."""
    import tensorflow as tf

    prefix = os.path.splitext(saved.path)[0]
    if saver is not None and os.path.exists(prefix + ".index"):
        saver.restore(session, prefix)
        return
    variables = tf.compat.v1.global_variables()
    if not variables:
        return
    session.run(tf.compat.v1.variables_initializer(variables))
    if not initial_values:
        initial_values.update(zip([v.op.name for v in variables], session.run(variables)))
        return
    for variable in variables:
        if variable.op.name in initial_values:
            variable.load(initial_values[variable.op.name], session)
