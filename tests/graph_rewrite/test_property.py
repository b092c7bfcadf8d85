"""Property tests over randomly generated graphs.

A graph is a random DAG of 4x4 float32 tensors built from allow, infer, deny, clear,
unlisted and Cast ops, with some nodes placed on the CPU and a random set of fetches.
For every graph and random settings the rewrite must: import and run, keep fetch and feed
dtypes, never put a deny-listed op in half, leave its input untouched, and be idempotent.
With TensorFlow's own settings it must also agree with TensorFlow's pass.
"""
import os

import numpy as np
import tensorflow as tf
from graph_runner import run_graph
from grappler_oracle import count_casts, dtype_differences, oracle_compat, oracle_lists, run_grappler_amp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.graph_rewrite.op_lists import effective_lists

tf1 = tf.compat.v1
HALF_TYPES = (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)

UNARY = {
    "tanh": tf.tanh, "sigmoid": tf.sigmoid, "softmax": tf.nn.softmax,
    "log": lambda a: tf.math.log(tf.abs(a) + 1),
    "exp": tf.exp, "relu": tf.nn.relu, "identity": tf.identity, "neg": tf.negative, "abs": tf.abs,
    "sin": tf.sin, "transpose": tf.transpose, "square": tf.square,
    "cast_of_compare": lambda a: tf.cast(a > 0, tf.float32),
}
BINARY = {
    "matmul": tf.matmul, "add": tf.add, "mul": tf.multiply, "maximum": tf.maximum,
    "pow": lambda a, b: tf.pow(tf.abs(a) + 1, b * 0.1), "sum_broadcast": lambda a, b: a + tf.reduce_sum(b),
}
OPS = sorted(UNARY) + sorted(BINARY)


@st.composite
def random_graphs(draw):
    """``(graph_def, fetches)``; node names n0, n1, ... after the feed ``x``."""
    count = draw(st.integers(2, 14))
    graph = tf.Graph()
    with graph.as_default():
        tensors = [tf1.placeholder(tf.float32, [4, 4], name="x"),
                   tf.constant(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4), name="c")]
        for i in range(count):
            op = draw(st.sampled_from(OPS))
            pick = lambda: tensors[draw(st.integers(0, len(tensors) - 1))]  # noqa: E731
            device = "/device:CPU:0" if draw(st.integers(0, 5)) == 0 else ""
            with tf.device(device), tf1.name_scope("op%d" % i):
                out = UNARY[op](pick()) if op in UNARY else BINARY[op](pick(), pick())
            tensors.append(tf.identity(out, name="n%d" % i))
    fetch_indices = draw(st.lists(st.integers(2, len(tensors) - 1), min_size=1, max_size=3, unique=True))
    return graph.as_graph_def(), ["n%d" % (i - 2) for i in fetch_indices]


SETTINGS = st.sampled_from([
    ("float16", "gpu", "latest"), ("float16", "cpu", "latest"), ("float16", "cpu", "tf2.15"),
    ("float16", "gpu", "tf1.15"), ("bfloat16", "cpu", "latest"), ("bfloat16", "gpu", "tf2.15"),
])
FEED = {"x:0": np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)}
_quick = settings(max_examples=int(os.environ.get("TFAMP_PROPERTY_EXAMPLES", "30")), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])


def _type_attrs(node):
    return {k: v.type for k, v in node.attr.items() if v.WhichOneof("value") == "type"}


@_quick
@given(random_graphs(), SETTINGS)
def test_rewrite_invariants(graph_and_fetches, options):
    graph_def, fetches = graph_and_fetches
    dtype, target, compat = options
    before = graph_def.SerializeToString(deterministic=True)
    result = rewrite_graph_def(graph_def, fetches=fetches, feeds=["x"], dtype=dtype, target=target,
                               compat=compat)
    assert graph_def.SerializeToString(deterministic=True) == before, "input was modified"

    rewritten = {n.name: n for n in result.graph_def.node}
    for node in graph_def.node:
        if node.name in fetches or node.name == "x":
            assert _type_attrs(rewritten[node.name]) == _type_attrs(node)
    deny = effective_lists(dtype, compat).deny
    for node in result.graph_def.node:
        if node.op in deny:
            assert not set(_type_attrs(node).values()) & set(HALF_TYPES), node.name

    tensors = [name + ":0" for name in fetches]
    original_values = run_graph(graph_def, tensors, FEED)
    values = run_graph(result.graph_def, tensors, FEED)
    assert [v.dtype for v in values] == [v.dtype for v in original_values]

    again = rewrite_graph_def(result.graph_def, fetches=fetches, feeds=["x"], dtype=dtype,
                              target=target, compat=compat)
    assert again.report.nodes_converted == 0 and again.report.casts_added == 0
    assert again.graph_def.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True)


@_quick
@given(random_graphs())
def test_agrees_with_tensorflow_on_random_graphs(graph_and_fetches):
    graph_def, fetches = graph_and_fetches
    for node in graph_def.node:
        node.device = ""  # TensorFlow's CPU mode skips GPU-placed nodes; none here
    theirs = run_grappler_amp(graph_def, fetches, ["x"])
    ours = rewrite_graph_def(graph_def, fetches=fetches, feeds=["x"], target="cpu",
                             compat=oracle_compat(), lists=oracle_lists())
    if theirs.succeeded:
        assert dtype_differences(graph_def, ours.graph_def, theirs.graph_def) == []
        assert count_casts(ours.graph_def, graph_def) <= count_casts(theirs.graph_def, graph_def)
    else:  # TensorFlow stops early when there is no allow-list op; so do we
        assert ours.report.nodes_converted == 0
