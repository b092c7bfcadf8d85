"""``compat``: by default the running TensorFlow's pass, whatever front door rewrites."""
import numpy as np
import pytest
import tensorflow as tf
from compat_graphs import vae_reconstruction_graph
from grappler_oracle import dtype_differences, oracle_compat, require_oracle, run_grappler_amp

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.graph_rewrite.compat import (
    COMPAT_ENV,
    compat_of_tensorflow,
    resolve_compat,
    running_tensorflow_version,
    session_compat,
)
from tfamp_rewrite.graph_rewrite.op_lists import builtin_lists, effective_lists

tf1 = tf.compat.v1
LEVEL = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL"


@pytest.mark.parametrize("version,dtype,compat", [
    ("1.15.5", "float16", "tf1.15"),
    ("1.15.5+nv23.03", "float16", "tf1.15"),
    ("1.15.5", "bfloat16", "latest"),       # TensorFlow 1.15 has no bfloat16 pass to follow
    ("2.15.1", "float16", "tf2.15"),
    ("2.19.1", "float16", "tf2.15"),         # the last without float16 infer-after-allow
    ("2.20.0", "float16", "latest"),         # tensorflow/tensorflow#84874
    ("2.21.0", "bfloat16", "latest"),
    ("2.22.0rc1", "float16", "latest"),
])
def test_each_tensorflow_version_maps_to_its_pass(version, dtype, compat):
    assert compat_of_tensorflow(version, dtype) == compat


def test_auto_is_the_running_tensorflows_pass():
    assert resolve_compat("auto") == resolve_compat(None) == compat_of_tensorflow(tf.__version__)
    assert running_tensorflow_version() == tf.__version__


def _reciprocal(result):
    (name,) = [d.name for d in result.report.decisions if d.op == "Reciprocal"]
    return result.report.decision(name)


def test_default_compat_keeps_the_vae_reciprocal_as_the_running_tensorflow_does():
    """The default follows the TensorFlow that runs: TF 1.15 and 2.15 keep the Reciprocal in
    the gradient of log(1e-10 + p) float32, and TensorFlow's own pass agrees on this graph."""
    graph_def = vae_reconstruction_graph()
    default = rewrite_graph_def(graph_def, fetches=["grad"], feeds=["x"], target="cpu")
    assert default.report.compat == compat_of_tensorflow(tf.__version__)
    by_compat = {c: _reciprocal(rewrite_graph_def(graph_def, fetches=["grad"], feeds=["x"], target="cpu",
                                                  compat=c)).converted
                 for c in ("tf1.15", "tf2.15", "latest")}
    assert by_compat == {"tf1.15": False, "tf2.15": False, "latest": True}
    assert _reciprocal(default).converted == by_compat[default.report.compat]


def test_the_default_paints_like_the_installed_tensorflows_own_pass():
    """Differential: with no compat given, our decisions equal TensorFlow's pass on a graph
    where infer-after-allow matters (oracle_compat probes which algorithm it runs)."""
    require_oracle("float16")
    graph_def = vae_reconstruction_graph()
    ours = rewrite_graph_def(graph_def, fetches=["grad"], feeds=["x"], target="cpu",
                             lists=builtin_lists("float16", oracle_compat()))
    theirs = run_grappler_amp(graph_def, fetches=["grad"], feeds=["x"])
    assert theirs.succeeded
    assert ours.report.compat == oracle_compat()
    assert dtype_differences(graph_def, ours.graph_def, theirs.graph_def) == []


def test_session_compat_setting(monkeypatch):
    monkeypatch.delenv(COMPAT_ENV, raising=False)
    assert session_compat() == "auto"
    monkeypatch.setenv(COMPAT_ENV, "TF1.15")
    assert session_compat() == "tf1.15"
    assert session_compat("latest") == "latest"          # the argument wins
    monkeypatch.setenv(COMPAT_ENV, "tf1.14")
    with pytest.raises(ValueError, match=COMPAT_ENV + "='tf1.14' is not a compat; use auto"):
        session_compat()
    with pytest.raises(ValueError, match="'latest', 'tf2.15', 'tf1.15', or 'auto'"):
        session_compat("newest")


def test_tensor_cores_only_empties_the_float16_lists_only(monkeypatch):
    """TensorFlow reads TENSOR_CORES_ONLY in its CUDA (float16) lists alone; its oneDNN
    bfloat16 lists stay whole."""
    monkeypatch.setenv(LEVEL, "TENSOR_CORES_ONLY")
    half = effective_lists("float16", "tf2.15")
    assert half.allow and not (half.infer or half.deny or half.clear)
    for compat in ("tf2.15", "latest"):
        assert effective_lists("bfloat16", compat) == builtin_lists("bfloat16", compat)


def test_tensor_cores_only_bfloat16_paints_like_tensorflow(monkeypatch):
    require_oracle("bfloat16")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.ones([8, 8], np.float32), name="w")
        h = tf.nn.relu(tf.matmul(x, w, name="mm1") + 1.0, name="relu")
        tf.identity(tf.matmul(tf.sigmoid(h, name="sigmoid"), w, name="mm2"), name="out")
    graph_def = graph.as_graph_def()
    theirs = run_grappler_amp(graph_def, fetches=["out"], dtype="bfloat16",
                              TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL="TENSOR_CORES_ONLY")
    assert theirs.succeeded
    monkeypatch.setenv(LEVEL, "TENSOR_CORES_ONLY")
    ours = rewrite_graph_def(graph_def, fetches=["out"], dtype="bfloat16", target="cpu",
                             compat=oracle_compat())
    assert ours.report.decision("sigmoid").converted  # between two MatMuls: the infer list is kept
    assert dtype_differences(graph_def, ours.graph_def, theirs.graph_def) == []
