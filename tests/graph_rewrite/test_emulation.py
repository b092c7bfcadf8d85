"""numerics="emulate": what a Tensor Core GPU computes, with float32 kernels, on any CPU.

The proofs are behavioural: fp16's limits (65504 overflows past 65519, 2^-24 is the
smallest subnormal, 2^-25 rounds to zero) come out where native half kernels put them;
accumulation is float32 as on a GPU (where a CPU's half kernels differ); and the results
are bit for bit those of TensorFlow's own fp16 emulation (``auto_mixed_precision_cpu``
with ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=1``) where that mode runs.
"""
from functools import partial

import grappler_case_graphs as case_graphs
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from graph_runner import run_graph
from grappler_oracle import oracle_compat, oracle_lists, run_grappler_amp
from model_graphs import MODELS

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.graph_rewrite.emulation import GATHER_OPS, VALUE_PRESERVING_OPS

tf1 = tf.compat.v1
HALF_ENUMS = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum}
TF_EMULATION = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16": "1"}
# TensorFlow's emulation mode fails inside these (an absl map lookup in the pass); ours runs.
TF_EMULATION_FAILS = {"lstm_dynamic_rnn_cf_v1", "while_loop_cf_v1"}

# Pairs of half-representable factors whose exact products sit on fp16's limits.
FP16_LIMITS = [
    (255.875, 256.0),        # 65504: the largest half, finite
    (255.5, 256.5),          # 65535.75: past 65520, rounds to inf
    (2.0 ** -12, 2.0 ** -12),      # 2^-24: the smallest subnormal, kept
    (2.0 ** -12, 2.0 ** -13),      # 2^-25: half-way, rounds to even: 0
    (1.5 * 2.0 ** -12, 2.0 ** -13),  # 1.5 * 2^-25: rounds up to 2^-24
    (2.0 ** -7, 2.0 ** -7),        # 2^-14: the smallest normal
]


def products_graph(a, b):
    """``out[i] = a[i] * b[i]``, each a single product inside a MatMul (an allow-list op)."""
    graph = tf.Graph()
    with graph.as_default():
        diag = tf.linalg.diag(tf.constant(np.asarray(a, np.float32)), name="diag_a")
        column = tf.constant(np.asarray(b, np.float32).reshape(-1, 1), name="b")
        tf.identity(tf.matmul(diag, column, name="mm"), name="out")
    return graph.as_graph_def()


def run_rewritten(graph_def, numerics, dtype="float16"):
    result = rewrite_graph_def(graph_def, fetches=["out"], target="cpu", dtype=dtype, numerics=numerics)
    return run_graph(result.graph_def, "out:0").ravel()


def test_emulation_and_native_agree_on_fp16_overflow_and_underflow():
    a, b = zip(*FP16_LIMITS)
    exact = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    want = exact.astype(np.float16).astype(np.float32)   # numpy rounds to nearest even
    assert list(np.isinf(want)) == [False, True, False, False, False, False]
    assert want[2] == want[4] == 2.0 ** -24 and want[3] == 0.0
    graph_def = products_graph(a, b)
    np.testing.assert_array_equal(run_rewritten(graph_def, "emulate"), want)
    np.testing.assert_array_equal(run_rewritten(graph_def, "native"), want)
    float32 = run_graph(graph_def, "out:0").ravel()
    assert np.isfinite(float32).all() and (float32 > 0).all()   # only half overflows / flushes


def test_emulated_bfloat16_rounds_like_bfloat16():
    a = [1.0, 1.0, 3.0, 2.0 ** 100]
    b = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -9, 1.0 + 2.0 ** -7, 2.0 ** 27]
    exact = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    want = exact.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    graph_def = products_graph(a, np.asarray(b, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32))
    got = run_rewritten(graph_def, "emulate", dtype="bfloat16")
    np.testing.assert_array_equal(got, want)
    assert got[0] == 1.0 and got[1] == 1.0 + 2.0 ** -7   # 8 significant bits, ties to even


def test_emulated_accumulation_is_float32_as_on_a_tensor_core():
    """Four products of 2^-26 each: 2^-24 on a GPU (float32 accumulator, one rounding);
    accumulating in half flushes every product to zero, as CPU half kernels may."""
    graph = tf.Graph()
    with graph.as_default():
        row = tf.constant(np.full([1, 4], 2.0 ** -13, np.float32))
        tf.identity(tf.matmul(row, tf.transpose(row), name="mm"), name="out")
    assert run_rewritten(graph.as_graph_def(), "emulate")[0] == 2.0 ** -24


@pytest.mark.parametrize("model", sorted(MODELS))
def test_emulated_graph_runs_float32_kernels_and_keeps_the_decisions(model):
    graph = MODELS[model]()
    native = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu")
    emulated = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                                 numerics="emulate")
    assert [(d.name, d.dtype, d.reason) for d in emulated.report.decisions] == \
        [(d.name, d.dtype, d.reason) for d in native.report.decisions]
    assert emulated.report.emulation.nodes == native.report.nodes_converted > 0
    bodies = [node for function in emulated.graph_def.library.function for node in function.node_def]
    for node in list(emulated.graph_def.node) + bodies:
        if node.op != "Cast":
            half = {v.type for v in node.attr.values()} & HALF_ENUMS
            assert not half, "%s (%s) still runs a half kernel" % (node.name, node.op)
    # every half output of a converted node is rounded, unless its op only moves values; a
    # gather of a table the pass casts rounds the rows it picks
    native_graph = tf.Graph()
    with native_graph.as_default():
        tf.import_graph_def(native.graph_def, name="")
    converted = [native_graph.get_operation_by_name(d.name) for d in native.report.decisions if d.converted]
    gathers_of_casts = {op.name for op in converted
                        if op.type in GATHER_OPS and op.inputs[0].op.type == "Cast"}
    half_outputs = {t.name for op in converted for t in op.outputs if t.dtype == tf.float16
                    and (op.type not in VALUE_PRESERVING_OPS or op.name in gathers_of_casts)}
    assert set(emulated.report.emulation.rounded_outputs) == half_outputs
    assert emulated.report.emulation.gathers_rounding_rows == len(gathers_of_casts)


def test_a_gather_of_a_cast_table_rounds_the_rows_it_picks_not_the_table():
    """Emulation reads an embedding table in float32 and rounds the looked-up rows: the same
    bits as rounding the table first (TensorFlow's emulation, above), without a pass over
    the whole table each run."""
    graph = MODELS["embedding_adagrad"]()
    result = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                               numerics="emulate")
    nodes = {node.name: node for node in result.graph_def.node}
    assert nodes["embedding_lookup"].input[0] == "embeddings/read"
    table_cast = [name for name, node in nodes.items()
                  if node.op == "Cast" and node.input[0] == "embeddings/read"]
    readers = [node.name for node in nodes.values() for text in node.input
               if text.split(":")[0].lstrip("^") in table_cast]
    assert table_cast and not readers, "the whole table is still rounded for %s" % readers
    assert result.report.emulation.gathers_rounding_rows == 1
    feeds = graph.feed_values(np.random.default_rng(1))
    rounded = result.report.emulation.rounded_outputs["embedding_lookup:0"]
    table, rows = run_graph(result.graph_def, ["embeddings:0", rounded], feeds, "init")
    picked = table[feeds["ids:0"]]
    np.testing.assert_array_equal(rows, picked.astype(np.float16).astype(np.float32))
    assert not np.array_equal(rows, picked)  # the rows were rounded


@pytest.mark.parametrize("model", sorted(set(MODELS) - TF_EMULATION_FAILS))
def test_bit_identical_to_tensorflows_own_fp16_emulation(model):
    """Same outputs, to the bit, as TensorFlow's emulation -- before and after training steps."""
    graph = MODELS[model]()
    theirs = run_grappler_amp(graph.graph_def, graph.fetches, graph.feeds, **TF_EMULATION)
    assert theirs.succeeded, "TensorFlow's emulation did not run on %s" % model
    ours = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                             numerics="emulate", compat=oracle_compat(), lists=oracle_lists())
    feeds = graph.feed_values(np.random.default_rng(0))
    outputs = [name + ":0" for name in graph.fetches if name != "train_op"]
    trains = "train_op" in graph.fetches
    for steps in (0, 3) if trains else (0,):
        want = run_graph(theirs.graph_def, outputs, feeds, "init", "train_op" if trains else None, steps)
        got = run_graph(ours.graph_def, outputs, feeds, "init", "train_op" if trains else None, steps)
        for name, w, g in zip(outputs, want, got):
            np.testing.assert_array_equal(g, w, err_msg="%s after %d steps" % (name, steps))


@pytest.mark.parametrize("model", sorted(TF_EMULATION_FAILS))
def test_emulation_where_tensorflows_own_fails(model):
    """v1 control flow: TensorFlow's emulation mode fails there; ours tracks float32."""
    graph = MODELS[model]()
    try:
        succeeded = run_grappler_amp(graph.graph_def, graph.fetches, graph.feeds, **TF_EMULATION).succeeded
    except IndexError:  # the pass's C++ error surfaces as an IndexError
        succeeded = False
    assert not succeeded, "TensorFlow's emulation runs on %s now: compare with it" % model
    ours = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                             numerics="emulate")
    feeds = graph.feed_values(np.random.default_rng(0))
    want = run_graph(graph.graph_def, "output:0", feeds, "init")
    got = run_graph(ours.graph_def, "output:0", feeds, "init")
    assert not np.array_equal(got, want)               # rounding to half happened
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("build", [partial(case_graphs.simple, case_graphs.CPU0), case_graphs.mixed_fanout],
                         ids=["cpu_simple", "cpu_mixed_fanout"])
def test_grapplers_cpu_emulation_tests(build):
    """AutoMixedPrecisionCpuTest's graphs: every allow op stays float32 (between Casts), and
    the outputs are TensorFlow's emulation's, to the bit."""
    graph = build()
    theirs = run_grappler_amp(graph.graph_def, graph.fetches, **TF_EMULATION).graph_def
    ours = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, target="cpu", numerics="emulate",
                             compat=oracle_compat(), lists=oracle_lists())
    allow = [node for node in ours.graph_def.node if node.op == "MatMul"]
    assert allow and all(node.attr["T"].type == tf.float32.as_datatype_enum for node in allow)
    fetches = [name + ":0" for name in graph.fetches]
    for name, want, got in zip(fetches, run_graph(theirs, fetches, graph.feed_values),
                               run_graph(ours.graph_def, fetches, graph.feed_values)):
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_rewriting_an_emulated_graph_changes_nothing():
    graph = MODELS["conv_net_momentum"]()
    first = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                              numerics="emulate")
    for numerics in ("emulate", "native"):
        again = rewrite_graph_def(first.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                                  numerics=numerics)
        assert again.report.nodes_converted == 0 and again.report.casts_added == 0
        assert again.graph_def == first.graph_def


def test_bad_numerics_names_the_choices():
    with pytest.raises(ValueError, match="'native' .*'emulate'"):
        rewrite_graph_def(products_graph([1.0], [1.0]), numerics="fake")
