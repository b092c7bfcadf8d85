"""The contract of rewrite_graph_def: arguments, purity, placement, cast naming, idempotence."""
import pytest
import tensorflow as tf
from model_graphs import MODELS
from test_numerics import overflow_probe_graph

from tfamp_rewrite import rewrite_graph_def

tf1 = tf.compat.v1
HALF, BF16, FLOAT = 19, 14, 1


@pytest.mark.parametrize("kwargs,words", [
    ({"dtype": "float8"}, "'float16' or 'bfloat16'"),
    ({"target": "tpu"}, "'gpu' or 'cpu'"),
    ({"compat": "tf1.14"}, "'latest', 'tf2.15', 'tf1.15', or 'auto'"),
    ({"fetches": ["nope"]}, "fetch 'nope' is not a node"),
    ({"feeds": ["y:0"]}, "feed 'y:0' is not a node"),
    ({"dtype": "bfloat16", "compat": "tf1.15"}, "only converts to float16"),
])
def test_bad_arguments_name_the_allowed_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        rewrite_graph_def(overflow_probe_graph(), **kwargs)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_input_untouched_and_rewrite_idempotent(model):
    graph = MODELS[model]()
    before = graph.graph_def.SerializeToString(deterministic=True)
    first = rewrite_graph_def(graph.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu")
    assert graph.graph_def.SerializeToString(deterministic=True) == before
    second = rewrite_graph_def(first.graph_def, fetches=graph.fetches, feeds=graph.feeds, target="cpu")
    assert second.report.nodes_converted == 0 and second.report.casts_added == 0
    assert second.graph_def == first.graph_def


def test_fetch_and_feed_accept_tensor_names_and_objects():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        out = tf.identity(tf.matmul(x, x), name="out")
    result = rewrite_graph_def(graph.as_graph_def(), fetches=[out], feeds="x:0", target="cpu")
    assert result.report.decision("out").reason == "preserved: fetch"
    assert result.report.decision("x").reason == "preserved: feed"


def placed_graph(device):
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        tf.identity(tf.matmul(x, x, name="mm"), name="out")
    return graph.as_graph_def()


@pytest.mark.parametrize("device,target,converted", [
    ("", "gpu", True), ("/device:GPU:0", "gpu", True), ("/job:worker/task:0/device:CPU:0", "gpu", False),
    ("/cpu:0", "cpu", True), ("/gpu:0", "cpu", True), ("", "cpu", True),
    # pinned to a task only, as replica_device_setter and an Estimator's TF_CONFIG pin them
    ("/job:worker/task:1", "gpu", True), ("/job:worker/replica:0/task:0", "cpu", True),
    ("/job:worker/task:0/cpu:0", "gpu", False),
])
def test_placement_decides_eligibility(device, target, converted):
    result = rewrite_graph_def(placed_graph(device), fetches=["out"], target=target)
    assert result.report.decision("mm").converted is converted
    if not converted:
        assert "placed on" in result.report.decision("mm").reason


@pytest.mark.parametrize("dtype,compat,name,input_name,dst", [
    ("float16", "latest", "x-0-CastToFp16-0-AutoMixedPrecision", "x", HALF),
    ("bfloat16", "latest", "x-0-CastToBf16-0-AutoMixedPrecision", "x", BF16),
    ("float16", "tf1.15", "x-0-CastToFp16-AutoMixedPrecision", "x:0", HALF),
])
def test_casts_are_shared_named_like_grappler_and_on_the_source_device(dtype, compat, name,
                                                                       input_name, dst):
    graph_def = placed_graph("/device:GPU:0")
    result = rewrite_graph_def(graph_def, fetches=["out"], dtype=dtype, compat=compat)
    casts = {n.name: n for n in result.graph_def.node if n.op == "Cast"}
    assert len(casts) == 2  # one shared Cast for both MatMul inputs, one back to float32
    cast = casts[name]
    assert list(cast.input) == [input_name]
    assert (cast.attr["SrcT"].type, cast.attr["DstT"].type) == (FLOAT, dst)
    assert cast.device == "/device:GPU:0"
    mm = next(n for n in result.graph_def.node if n.name == "mm")
    assert list(mm.input) == [name, name]


def test_cast_names_stay_unique():
    graph_def = placed_graph("")
    taken = graph_def.node.add(name="x-0-CastToFp16-0-AutoMixedPrecision", op="NoOp")
    assert taken
    result = rewrite_graph_def(graph_def, fetches=["out"])
    assert "x-0-CastToFp16-1-AutoMixedPrecision" in {n.name for n in result.graph_def.node}


def test_exclusions_leave_nodes_exactly_as_they_are():
    model = MODELS["conv_net_momentum"]()
    result = rewrite_graph_def(model.graph_def, fetches=model.fetches, target="cpu",
                               op_types_to_exclude=["Conv2D"], nodes_to_exclude=["logits/MatMul"])
    conv = [d for d in result.report.decisions if d.op == "Conv2D"]
    assert conv and not any(d.converted for d in conv)
    assert result.report.decision("logits/MatMul").reason == "excluded by name"
    assert result.report.decision("gradients/conv1/Conv2D_grad/Conv2DBackpropInput").converted


def test_a_graph_whose_every_allow_op_is_excluded_says_so_not_that_none_computes_in_float32():
    """A session whose heals kept every MatMul and Conv float32 said of its next graph 'no
    eligible allow-list op computes in float32', though all of them do."""
    model = MODELS["conv_net_momentum"]()
    allow = [n.name for n in model.graph_def.node if n.op in ("MatMul", "Conv2D", "Conv2DBackpropInput",
                                                              "Conv2DBackpropFilter")]
    result = rewrite_graph_def(model.graph_def, fetches=model.fetches, target="cpu",
                               nodes_to_exclude=["^%s$" % name for name in allow])
    assert result.report.nodes_converted == 0
    assert result.report.nothing_converted_because == (
        "every float32 allow-list op (%d) is excluded by name (nodes_to_exclude, "
        "TFAMP_REWRITE_NODES_TO_EXCLUDE, or a session's heals): nothing to convert" % len(allow))


def test_nodes_to_exclude_takes_the_patterns_the_log_lines_give():
    """Names, tensor names, and regular expressions matched from the start (``'^logits/MatMul$'``,
    as the session's lines and the command line give them) exclude the same nodes."""
    model = MODELS["conv_net_momentum"]()
    for spelling in (["logits/MatMul"], ["logits/MatMul:0"], ["^logits/MatMul$"]):
        result = rewrite_graph_def(model.graph_def, fetches=model.fetches, target="cpu",
                                   nodes_to_exclude=spelling)
        excluded = [d.name for d in result.report.decisions if d.reason == "excluded by name"]
        assert excluded == ["logits/MatMul"], spelling
    result = rewrite_graph_def(model.graph_def, fetches=model.fetches, target="cpu",
                               nodes_to_exclude=["conv"])
    excluded = {d.name for d in result.report.decisions if d.reason == "excluded by name"}
    assert {"conv0/Conv2D", "conv1/Conv2D"} <= excluded
    with pytest.raises(ValueError, match="neither a node of the graph nor a pattern matching one"):
        rewrite_graph_def(model.graph_def, fetches=model.fetches, nodes_to_exclude=["^nothing$"])


def test_fused_batch_norm_is_upgraded_to_v2_with_float32_scale():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [1, 4, 4, 2], name="x")
        w = tf.ones([1, 1, 2, 2])
        conv = tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME")
        y = tf.raw_ops.FusedBatchNorm(x=conv, scale=tf.ones([2]), offset=tf.zeros([2]),
                                      mean=tf.zeros([0]), variance=tf.zeros([0]), name="bn")
        tf.identity(tf.nn.conv2d(y[0], w, [1, 1, 1, 1], "SAME"), name="out")
    result = rewrite_graph_def(graph.as_graph_def(), fetches=["out"], target="cpu")
    bn = next(n for n in result.graph_def.node if n.name == "bn")
    assert bn.op == "FusedBatchNormV2"
    assert (bn.attr["T"].type, bn.attr["U"].type) == (HALF, FLOAT)
    assert any("upgraded" in note for note in result.report.notes)
