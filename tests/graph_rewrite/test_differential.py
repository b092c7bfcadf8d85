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
