"""use_rounding_op: emulation's rounding Cast pairs become RoundToHalf nodes, results unchanged.

Behavioural: the emulated graph with RoundToHalf nodes computes exactly the bits the
graph with Cast pairs computes -- outputs and, for training graphs, the weights after
three steps -- on conv nets, transformers, while loops (v1 and v2: function bodies) and
function calls; each tensor a running (or fetchable) Cast pair rounded is rounded by one
RoundToHalf node, and no pair runs any more; the fetchable rounded outputs follow the rename.
"""
import numpy as np
import pytest
import tensorflow as tf
from graph_runner import copy_of, run_graph
from model_graphs import MODELS

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.fused_op.round_to_half import round_to_half_available
from tfamp_rewrite.graph_rewrite.rounding import ROUND_OP_TYPE, is_emulation_node, use_rounding_op

tf1 = tf.compat.v1
MODELS_RUN = ("conv_net_momentum", "transformer_adam", "while_loop_cf_v1", "while_loop_cf_v2",
              "function_call")
GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
HALF_ENUMS = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum}


@pytest.fixture(scope="module", autouse=True)
def library():
    assert round_to_half_available(), "the op library must build and load (make op)"


def bodies(graph_def):
    """The node lists of the graph and of each function body."""
    return [list(graph_def.node)] + [list(f.node_def) for f in graph_def.library.function]


def live_roundings(graph_def):
    """``[(rounded tensor, half type)]`` of the rounding Cast pairs that run or can be
    fetched: a Cast back to float32 the rewrite added, reading one to half it added, that
    has readers or is emulation's (a rounded output)."""
    def is_cast(node, to_half):
        return (node is not None and node.op == "Cast" and node.name.endswith("AutoMixedPrecision")
                and (node.attr["DstT"].type in HALF_ENUMS) == to_half)

    found = []
    for nodes in bodies(graph_def):
        by_name = {node.name: node for node in nodes}
        read = {text.lstrip("^").split(":")[0] for node in nodes for text in node.input}
        for node in nodes:
            narrow = by_name.get(node.input[0].split(":")[0]) if node.input else None
            live = node.name in read or is_emulation_node(node)
            if live and is_cast(node, False) and is_cast(narrow, True):
                found.append((narrow.input[0], narrow.attr["DstT"].type))
    return found


def rounding_nodes(graph_def):
    return [(node.input[0], node.attr["half_type"].type) for nodes in bodies(graph_def) for node in nodes
            if node.op == ROUND_OP_TYPE]


def emulated(model, dtype="float16"):
    graph = MODELS[model]()
    result = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                               numerics="emulate", dtype=dtype)
    return graph, result


@pytest.mark.parametrize("model, dtype",
                         [(m, "float16") for m in MODELS_RUN] + [("conv_net_momentum", "bfloat16")])
def test_rounding_ops_compute_the_cast_pairs_bits(model, dtype):
    graph, result = emulated(model, dtype)
    fused = copy_of(result.graph_def)
    rounding = use_rounding_op(fused, result.report.emulation)
    # one RoundToHalf node per tensor the Cast pairs rounded, and no pair left running
    assert sorted(rounding_nodes(fused)) == sorted(set(live_roundings(result.graph_def)))
    assert len(rounding_nodes(fused)) == rounding.replaced == result.report.emulation.rounding_ops > 0
    assert live_roundings(fused) == []
    feeds = graph.feed_values(np.random.default_rng(0))
    outputs = [name + ":0" for name in graph.fetches if name != "train_op"]
    trains = "train_op" in graph.fetches
    for steps in (0, 3) if trains else (0,):
        want = run_graph(result.graph_def, outputs, feeds, "init", "train_op" if trains else None, steps)
        got = run_graph(fused, outputs, feeds, "init", "train_op" if trains else None, steps)
        for name, w, g in zip(outputs, want, got):
            g, w = np.asarray(g), np.asarray(w)
            assert (g.dtype, g.shape, g.tobytes()) == (w.dtype, w.shape, w.tobytes()), \
                "%s after %d steps" % (name, steps)


def test_fetched_rounded_outputs_follow_the_rename():
    graph, result = emulated("conv_net_momentum")
    before = dict(result.report.emulation.rounded_outputs)
    fused = copy_of(result.graph_def)
    rounding = use_rounding_op(fused, result.report.emulation)
    after = result.report.emulation.rounded_outputs
    assert set(after) == set(before) and rounding.renamed
    assert all(after[output] == rounding.renamed.get(tensor, tensor) for output, tensor in before.items())
    names = {node.name: node.op for node in fused.node}
    assert all(names[tensor.split(":")[0]] == ROUND_OP_TYPE for tensor in after.values())
    feeds = graph.feed_values(np.random.default_rng(1))
    outputs = sorted(before)
    want = run_graph(result.graph_def, [before[o] for o in outputs], feeds, "init")
    got = run_graph(fused, [after[o] for o in outputs], feeds, "init")
    for output, w, g in zip(outputs, want, got):
        np.testing.assert_array_equal(g, w, err_msg=output)


def test_a_float32_reader_of_an_emulated_output_reads_the_rounding_op():
    """``next`` is a fetch, so it stays float32 and the pass casts the emulated MatMul's half
    output back for it: that pair is bypassed -- ``next`` reads the RoundToHalf node -- and
    the pass's Cast stays, unread, so a fetch by its name still works."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full([2, 2], 1.0 / 3, np.float32))
        tf.identity(tf.matmul(tf.matmul(x, x, name="mm"), x, name="mm2"), name="next")
    result = rewrite_graph_def(graph.as_graph_def(), fetches=["mm", "next"], target="cpu", numerics="emulate")
    fused = copy_of(result.graph_def)
    rounding = use_rounding_op(fused)
    assert rounding.bypassed == 1 and rounding.narrowing_kept >= 1
    nodes = {node.name: node for node in fused.node}
    (reads,) = nodes["next"].input
    assert nodes[reads].op == ROUND_OP_TYPE and nodes[reads].input == ["mm2"]
    back_cast = [name for name in nodes if name.startswith("mm2-0-CastToFp32")]
    assert back_cast and not [n for n in nodes.values() if back_cast[0] in n.input]
    for fetch in ("mm:0", "next:0", back_cast[0] + ":0"):
        np.testing.assert_array_equal(run_graph(fused, fetch), run_graph(result.graph_def, fetch))


def test_pairs_placed_on_a_gpu_stay_casts():
    _, result = emulated("conv_net_momentum")
    placed = copy_of(result.graph_def)
    for node in placed.node:
        node.device = GPU
    pairs = live_roundings(placed)
    rounding = use_rounding_op(placed)
    assert rounding.replaced == 0 and rounding.kept_on_gpu >= len(pairs) > 0
    assert live_roundings(placed) == pairs and not rounding_nodes(placed)


def test_replacing_or_rewriting_again_changes_nothing():
    graph, result = emulated("transformer_adam")
    fused = copy_of(result.graph_def)
    use_rounding_op(fused)
    again = copy_of(fused)
    assert use_rounding_op(again).replaced == 0 and again == fused
    rewritten = rewrite_graph_def(fused, fetches=graph.fetches, feeds=graph.feeds, target="cpu",
                                  numerics="emulate")
    assert rewritten.report.nodes_converted == 0 and rewritten.graph_def == fused


def test_the_summary_counts_the_rounding_ops():
    _, result = emulated("while_loop_cf_v1")
    rounding = use_rounding_op(copy_of(result.graph_def), result.report.emulation)
    assert "rounding by %d RoundToHalf op(s) now" % rounding.replaced in result.report.summary()
