"""What the Grappler test-case files check, once: expectations, outputs, TensorFlow's pass.

A ``GrapplerCase`` is one re-expressed C++ test: its graph builder, the rewrite options,
and the test's own expectations (nodes added, the dtype of each named type attribute).
Expectation keys are ``node`` (its ``T``, else ``dtype``, ``element_dtype`` or
``elem_type``) or ``node.attr`` (``clr1.T[2]`` for an element of a list attribute).

Where a result deliberately differs from what the C++ test expects, the case names the
keys that come out the other way and why (``Divergence``): ``ours`` for this rewrite at
the case's ``compat``, ``tf`` for TensorFlow 2.15.1's own CPU pass.  The checks assert
that exactly those keys differ, so a divergence that disappears fails too.

``dtype_of`` / ``output_dtype`` read a graph; the Python-peer tests use them too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from graph_runner import run_graph
from grappler_case_graphs import CaseGraph
from grappler_oracle import (
    dtype_differences,
    oracle_compat,
    oracle_lists,
    require_oracle,
    run_grappler_amp,
)

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.tf_compat import lookup_op_def

FLOAT = "float32"
F32_EPS = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class Divergence:
    """Expectation keys that come out the other way (low <-> float32), and why; ``casts``
    is a different ``(to low, to float32)`` Cast count where a test counts them."""

    keys: str
    reason: str
    casts: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class GrapplerCase:
    """One Grappler test re-expressed: graph, rewrite options, the test's expectations."""

    id: str
    build: Callable[[], CaseGraph]
    added: Optional[int]                # nodes the rewrite adds (None: the test says not)
    low: str = ""                       # keys expected in the target dtype
    float32: str = ""                   # keys expected to stay float32
    other: Mapping[str, str] = field(default_factory=dict)  # e.g. {"cst1.SrcT": "bool"}
    ops: Mapping[str, str] = field(default_factory=dict)    # node -> op type afterwards
    compat: str = "latest"
    dtype: str = "float16"
    target: str = "gpu"                 # device-less nodes land on the (virtual) GPU
    unchanged: bool = False             # VerifyGraphsEquivalent: names, ops, inputs
    tolerance: Tuple[float, float] = (1e-6, 0.0)   # (atol, rtol) of the C++ check
    cast_edges: Mapping[Tuple[str, str], Optional[str]] = field(default_factory=dict)
    ours: Optional[Divergence] = None   # this rewrite vs the test's expectations
    tf: Optional[Divergence] = None     # TensorFlow 2.15.1's CPU pass vs them
    oracle_fetches: Optional[Tuple[str, ...]] = None  # when the case fetches nothing

    def expected(self, divergence: Optional[Divergence] = None) -> Dict[str, str]:
        """``{key: dtype name}``, with ``divergence``'s keys swapped low <-> float32."""
        low = self.dtype
        result = {key: low for key in self.low.split()}
        result.update({key: FLOAT for key in self.float32.split()})
        for key in divergence.keys.split() if divergence else ():
            result[key] = FLOAT if result[key] == low else low
        result.update(self.other)
        return result


def nodes_by_name(graph_def) -> Dict[str, object]:
    return {node.name: node for node in graph_def.node}


def attr_value(node, name: str):
    """``node.attr[name]``, or its op's default where the graph leaves it out (compat tf1.15)."""
    if name in node.attr:
        return node.attr[name]
    op_def = lookup_op_def(node.op)
    return next(a.default_value for a in op_def.attr if a.name == name)


def dtype_of(node, attr: str = None) -> str:
    """The dtype name of ``attr`` (by default the first of ``T``, ``dtype``,
    ``element_dtype``, ``elem_type`` the node has); ``attr`` may be ``"T[1]"`` for an
    element of a list(type) attribute."""
    if attr is None:
        attr = next(a for a in ("T", "dtype", "element_dtype", "elem_type") if a in node.attr)
    if attr.endswith("]"):
        name, index = attr[:-1].split("[")
        return tf.as_dtype(attr_value(node, name).list.type[int(index)]).name
    return tf.as_dtype(attr_value(node, attr).type).name


def output_dtype(node, port: int = 0) -> str:
    """The dtype name of output ``port`` of ``node`` (what a cost graph reports)."""
    op_def = lookup_op_def(node.op)
    arg = op_def.output_arg[port]
    if arg.type_attr:
        return tf.as_dtype(attr_value(node, arg.type_attr).type).name
    return tf.as_dtype(arg.type).name


def tensor_names(fetches: Sequence[str]):
    """``x`` -> ``x:0``; tensor names stay as they are."""
    return [name if ":" in name else name + ":0" for name in fetches]


@functools.lru_cache(maxsize=None)
def graph_of(build: Callable[[], CaseGraph]) -> CaseGraph:
    """Each builder runs once per session (the rewrite never mutates its input)."""
    return build()


def rewrite(case: GrapplerCase, numerics: str = "native"):
    graph = graph_of(case.build)
    return rewrite_graph_def(graph.graph_def, fetches=graph.fetches, dtype=case.dtype,
                             target=case.target, compat=case.compat, numerics=numerics)


def dtypes_at(graph_def, keys) -> Dict[str, str]:
    """``{key: dtype name}`` read from ``graph_def`` (keys as in the module docstring)."""
    nodes = nodes_by_name(graph_def)
    result = {}
    for key in keys:
        name, _, attr = key.partition(".")
        result[key] = dtype_of(nodes[name], attr or None)
    return result


def cast_on_edge(graph_def, src: str, dst: str) -> Optional[str]:
    """``"<SrcT>-><DstT>"`` of the Cast the rewrite put between ``src`` and ``dst``, or None."""
    nodes = nodes_by_name(graph_def)
    for text in nodes[dst].input:
        producer = nodes.get(text.split(":")[0])
        if producer is not None and producer.op == "Cast" and producer.input[0].split(":")[0] == src:
            return "%s->%s" % (dtype_of(producer, "SrcT"), dtype_of(producer, "DstT"))
    return None


def assert_expectations(case: GrapplerCase, result) -> None:
    """The C++ test's assertions, on our rewrite at the case's compat."""
    original = graph_of(case.build).graph_def
    rewritten = result.graph_def
    if case.added is not None:
        assert len(rewritten.node) - len(original.node) == case.added
    expected = case.expected(case.ours)
    assert dtypes_at(rewritten, expected) == expected
    nodes = nodes_by_name(rewritten)
    assert {name: nodes[name].op for name in case.ops} == dict(case.ops)
    if case.unchanged:
        assert [(n.name, n.op, list(n.input)) for n in rewritten.node] == \
            [(n.name, n.op, list(n.input)) for n in original.node]
    edges = {edge: cast_on_edge(rewritten, *edge) for edge in case.cast_edges}
    assert edges == dict(case.cast_edges)


def assert_outputs_close(case: GrapplerCase) -> None:
    """The fetches of the rewritten graph match the original's within the C++ tolerance,
    computed as a GPU computes them (emulated: the C++ tests ran on GPUs); the graph with
    this CPU's own half kernels runs too (its values depend on the CPU)."""
    graph = graph_of(case.build)
    fetches = tensor_names(graph.fetches)
    expected = run_graph(graph.graph_def, fetches, graph.feed_values)
    emulated = run_graph(rewrite(case, "emulate").graph_def, fetches, graph.feed_values)
    native = run_graph(rewrite(case).graph_def, fetches, graph.feed_values)
    atol, rtol = case.tolerance
    for name, want, got, ran in zip(graph.fetches, expected, emulated, native):
        assert got.dtype == want.dtype and ran.dtype == want.dtype, name
        assert ran.shape == want.shape, name
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   atol=atol, rtol=rtol, err_msg=name)


def added_casts(graph_def, original) -> Dict[str, str]:
    """``{name: input}`` of every Cast node that is not in ``original``."""
    names = {node.name for node in original.node}
    return {node.name: node.input[0] for node in graph_def.node
            if node.op == "Cast" and node.name not in names}


def assert_same_as_tensorflow(graph_def, fetches, dtype: str = "float16"):
    """Ours and TensorFlow's CPU pass, with its lists and rules, agree on every dtype.

    Ours runs with ``target="cpu"`` (TensorFlow's CPU mode processes unplaced and CPU
    nodes; no case places a node on a GPU, where ``target="cpu"`` deliberately goes
    further, see eligibility.py) and ``compat=oracle_compat()``: TF 2.15 applies
    infer-after-allow in its bfloat16 pass only, newer TensorFlow in both.  Every Cast
    we add is one TensorFlow adds (same name, same input).  Returns TensorFlow's graph.
    """
    require_oracle(dtype)
    theirs = run_grappler_amp(graph_def, fetches, dtype=dtype).graph_def
    ours = rewrite_graph_def(graph_def, fetches=fetches, dtype=dtype, target="cpu",
                             compat=oracle_compat(), lists=oracle_lists(dtype)).graph_def
    assert dtype_differences(graph_def, ours, theirs) == []
    assert added_casts(ours, graph_def).items() <= added_casts(theirs, graph_def).items()
    return theirs


def assert_matches_tensorflow(case: GrapplerCase) -> None:
    """``assert_same_as_tensorflow``, then TensorFlow's own result held against the C++
    test's expectations: exactly ``case.tf``'s keys differ."""
    graph = graph_of(case.build)
    fetches = case.oracle_fetches if case.oracle_fetches is not None else graph.fetches
    theirs = assert_same_as_tensorflow(graph.graph_def, fetches, case.dtype)
    expected = case.expected()
    actual = dtypes_at(theirs, expected)
    differing = {key for key in expected if actual[key] != expected[key]}
    assert differing == set(case.tf.keys.split() if case.tf else ())
