"""Differential tests: our rewrite against TensorFlow's own Grappler AMP pass.

Both run on the same GraphDef with the same fetches and feeds: TensorFlow's
``auto_mixed_precision_cpu`` (emulation off) or ``auto_mixed_precision_onednn_bfloat16``,
ours with ``target="cpu"``, the lists the installed TensorFlow really uses and the
algorithm version it implements (``oracle_compat``).  Every float32 type attribute of
every original node -- in the graph and in rewritten function bodies -- must end with
the same dtype, and we must not add more Casts than TensorFlow.
"""
import pytest
from grappler_oracle import (
    count_casts,
    dtype_differences,
    function_dtype_differences,
    oracle_compat,
    oracle_lists,
    require_oracle,
    run_grappler_amp,
)
from model_graphs import MODELS

from tfamp_rewrite import rewrite_graph_def

CASES = [(name, "float16") for name in MODELS] + [
    ("conv_net_momentum", "bfloat16"),
    ("transformer_adam", "bfloat16"),
    ("lstm_dynamic_rnn_cf_v1", "bfloat16"),
]


@pytest.mark.parametrize("model,dtype", CASES)
def test_same_dtypes_as_tensorflow(model, dtype):
    require_oracle(dtype)
    graph = MODELS[model]()
    theirs = run_grappler_amp(graph.graph_def, graph.fetches, graph.feeds, dtype=dtype)
    assert theirs.succeeded, "TensorFlow's pass failed on %s" % model
    ours = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds,
                             dtype=dtype, target="cpu", compat=oracle_compat(),
                             lists=oracle_lists(dtype))
    assert ours.report.nodes_converted > 0
    assert dtype_differences(graph.graph_def, ours.graph_def, theirs.graph_def) == []
    assert function_dtype_differences(ours.graph_def, theirs.graph_def) == []
    assert count_casts(ours.graph_def, graph.graph_def) <= count_casts(theirs.graph_def, graph.graph_def)


def test_function_bodies_are_rewritten_like_tensorflow():
    """The meta-optimizer rewrites reachable function bodies; so do we (and report it)."""
    graph = MODELS["function_call"]()
    ours = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, target="cpu", compat="latest")
    (function,) = ours.report.functions
    assert function.status == "rewritten"
    converted = sorted((d.category, d.op) for d in function.report.decisions if d.converted)
    # the matmul (BatchMatMulV2 inside a Defun: shapes unknown), and -- newest behaviour --
    # the Tanh directly after it; arguments and results keep float32
    assert converted == [("allow", "BatchMatMulV2"), ("infer", "Tanh")]
    body = ours.graph_def.library.function[0]
    assert {n.attr["T"].type for n in body.node_def if n.op in ("BatchMatMulV2", "Tanh")} == {19}
    assert [arg.type for arg in body.signature.input_arg] == [1, 1]  # DT_FLOAT


def _input_pipeline_graph(marked: bool):
    """A model reading a ``Dataset.map`` whose function multiplies matrices (a colour
    conversion), as TF1 programs feed theirs; ``marked=False`` drops TensorFlow 2's
    ``_tf_data_function`` mark, as TensorFlow 1.15's graphs have none."""
    import numpy as np
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        images = np.random.default_rng(0).uniform(0, 255, (8, 4, 4, 3)).astype(np.float32)
        dataset = tf1.data.Dataset.from_tensor_slices(images).map(tf.image.rgb_to_grayscale).batch(4)
        batch = tf1.data.make_one_shot_iterator(dataset).get_next()
        weights = tf.constant(np.ones([16, 8], np.float32))
        tf.identity(tf.linalg.matmul(tf.reshape(batch, [4, 16]), weights), name="out")
    graph_def = graph.as_graph_def()
    if not marked:
        for function in graph_def.library.function:
            function.attr.pop("_tf_data_function", None)
    return graph_def


@pytest.mark.parametrize("marked", [True, False], ids=["tf2_marked", "tf1_unmarked"])
def test_input_pipeline_functions_are_left_float32_as_tensorflow_leaves_them(marked):
    """Grappler's meta-optimizer leaves tf.data's functions to tf.data: a MatMul in a
    ``Dataset.map`` stays float32, said in the report, while the model's own converts."""
    graph_def = _input_pipeline_graph(marked)
    ours = rewrite_graph_def(graph_def, fetches=["out"], target="cpu", compat="latest")
    (mapped,) = [f for f in ours.report.functions if "map" in f.name.lower()]
    assert mapped.status == "untouched" and "tf.data function" in mapped.reason
    assert any(d.converted and d.op == "MatMul" for d in ours.report.decisions)
    body = {f.signature.name: f for f in ours.graph_def.library.function}[mapped.name]
    assert {n.attr["T"].type for n in body.node_def if "MatMul" in n.op} == {1}  # DT_FLOAT
    if marked:
        require_oracle("float16")
        theirs = run_grappler_amp(graph_def, ["out"], {}, dtype="float16")
        assert theirs.succeeded
        assert function_dtype_differences(ours.graph_def, theirs.graph_def) == []
