"""Cast(Const) folded into half constants: same values as the runtime Cast, half the bytes,
and the documented rules for constants that do not fit."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import FLOAT, HALF, node_types, read_graph, run_graph, run_main

from tfamp_rewrite import rewrite_graph_def
from tfamp_rewrite.saved_graph.constants import (
    clamp_to_range,
    fold_constants,
    from_half_bits,
    range_issue,
    to_half_bits,
)

tf1 = tf.compat.v1
EDGE_VALUES = np.array([0.0, -0.0, 1.0, -1.5, 65504.0, 65519.0, 65520.0, 1e5, -1e5, 6e-8, 2.9e-8, 3.0e-8,
                        1e-9, np.inf, -np.inf, 3.3895e38, 3.4e38, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1e-39],
                       np.float32)


def _tensorflow_cast(values, dtype):
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as session:
        return session.run(tf.cast(tf.constant(values), dtype))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_bits_round_like_tensorflows_cast(dtype):
    values = np.concatenate([EDGE_VALUES, np.random.default_rng(0).standard_normal(10000) *
                             10.0 ** np.random.default_rng(1).integers(-10, 6, 10000)]).astype(np.float32)
    expected = _tensorflow_cast(values, getattr(tf, dtype))
    ours = to_half_bits(values, dtype)
    np.testing.assert_array_equal(ours, np.asarray(expected).view(np.uint16))
    np.testing.assert_array_equal(from_half_bits(ours, dtype), np.asarray(expected).astype(np.float32))


def test_nan_stays_nan_in_bfloat16():
    bits = to_half_bits(np.array([np.nan, -np.nan], np.float32), "bfloat16")
    assert np.isnan(from_half_bits(bits, "bfloat16")).all()


def test_range_issue_counts_overflow_significant_and_negligible_underflow():
    weights = np.concatenate([np.full(10, 0.5, np.float32), [1e-9, -2e-9], [7e4, -1e6]]).astype(np.float32)
    issue, negligible = range_issue("w", weights, "float16")
    assert (issue.overflow, issue.underflow, negligible) == (2, 0, 2)  # 1e-9 next to 1e6: negligible
    issue, negligible = range_issue("eps", np.array([1e-9, 0.0], np.float32), "float16")
    assert (issue.overflow, issue.underflow, negligible) == (0, 1, 0)
    assert range_issue("ok", np.array([0.5, -3.0, 1e-9], np.float32), "float16") == (None, 1)
    assert range_issue("bf", np.array([1e5, 1e-9], np.float32), "bfloat16") == (None, 0)


def test_clamp_keeps_signs_and_leaves_negligible_values():
    clamped = clamp_to_range(np.array([1e5, -1e6, 1.0], np.float32), "float16")
    np.testing.assert_array_equal(clamped, [65504.0, -65504.0, 1.0])
    tiny = clamp_to_range(np.array([-1e-9, 2e-9], np.float32), "float16")
    np.testing.assert_array_equal(tiny, np.float32([-(2.0 ** -24), 2.0 ** -24]))


def _graph(shared: bool = False):
    """x -> mm(x, w) -> bias(b) -> out; with ``shared`` w also feeds a float32 Sum (deny)."""
    graph = tf.Graph()
    rng = np.random.default_rng(2)
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 32], name="x")
        w = tf.constant(rng.standard_normal([32, 16]).astype(np.float32), name="w")
        b = tf.constant(np.full([16], 0.25, np.float32), name="b")
        out = tf.nn.bias_add(tf.linalg.matmul(x, w, name="mm"), b, name="bias")
        if shared:
            out = tf.add(out, tf.reduce_sum(w, name="w_sum"), name="total")
        tf.identity(out, name="out")
    return graph.as_graph_def()


@pytest.mark.parametrize("dtype, target", [("float16", "gpu"), ("bfloat16", "cpu")])
@pytest.mark.parametrize("shared", [False, True], ids=["in_place", "shared_with_float32"])
def test_folded_graph_computes_exactly_what_the_casts_computed(dtype, target, shared):
    rewritten = rewrite_graph_def(_graph(shared), fetches=["out"], feeds=["x"], dtype=dtype, target=target,
                                  compat="latest")  # the counts below are the newest pass's
    folded = type(rewritten.graph_def)()
    folded.CopyFrom(rewritten.graph_def)
    report = fold_constants(folded, rewritten.report.casts, dtype, preserved={"out", "x"})
    feed = {"x:0": np.random.default_rng(3).standard_normal([4, 32]).astype(np.float32)}
    np.testing.assert_array_equal(run_graph(folded, ["out:0"], feed)[0],
                                  run_graph(rewritten.graph_def, ["out:0"], feed)[0])
    types, half = node_types(folded), getattr(tf, dtype).as_datatype_enum
    assert report.folded == 2 and report.bytes_before == 4 * (32 * 16 + 16) == 2 * report.bytes_after
    if shared:  # w keeps float32 for Sum; the Cast became a half Const with the Cast's name
        assert types["w"] == ("Const", FLOAT)
        kind = "CastToFp16" if dtype == "float16" else "CastToBf16"
        assert types["w-0-%s-0-AutoMixedPrecision" % kind] == ("Const", half)
        assert report.casts_removed == 1
    else:
        assert types["w"] == ("Const", half) and report.casts_removed == 2
        assert not [name for name, (op, _) in types.items() if op == "Cast" and name.startswith(("w-", "b-"))]


def test_graph_outputs_and_broadcast_constants_keep_their_form():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.constant(0.5, shape=[8, 8], name="w")  # one stored value, broadcast
        tf.identity(tf.linalg.matmul(x, w, name="mm"), name="out")
    rewritten = rewrite_graph_def(graph.as_graph_def(), fetches=["out", "w"], feeds=["x"])
    report = fold_constants(rewritten.graph_def, rewritten.report.casts, "float16",
                            preserved={"w", "x", "out"})
    nodes = {node.name: node for node in rewritten.graph_def.node}
    assert nodes["w"].attr["dtype"].type == FLOAT  # an output: unchanged
    half_const = nodes["w-0-CastToFp16-0-AutoMixedPrecision"]
    assert half_const.op == "Const" and list(half_const.attr["value"].tensor.half_val) == [
        int(np.float16(0.5).view(np.uint16))]
    assert report.folded == 1


def test_keep_float32_follows_identity_reads_to_the_constant(tmp_path, capsys):
    """A frozen variable read (Const -> Identity -> MatMul) that overflows keeps the MatMul float32."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        read = tf.identity(tf.constant(np.full([8, 8], 1e5, np.float32), name="kernel"), name="kernel/read")
        tf.identity(tf.linalg.matmul(x, read, name="mm"), name="out")
    path = str(tmp_path / "g.pb")
    with open(path, "wb") as handle:
        handle.write(graph.as_graph_def().SerializeToString())
    code, out, _ = run_main(capsys, "explain", path, "--node", "mm")
    assert code == 0
    assert "mm: float32 (root cause: 'kernel', Const, unlisted)" in out
    assert "kept float32: it reads constant 'kernel'" in out
    code, out, _ = run_main(capsys, "convert", path, str(tmp_path / "out.pb"))
    assert node_types(read_graph(str(tmp_path / "out.pb")))["mm"][1] == FLOAT
    assert "warning: constant 'kernel' does not fit float16 (64 of 64 value(s) overflow" in out


def test_half_constants_halve_the_stored_bytes(tmp_path, capsys):
    path = str(tmp_path / "g.pb")
    with open(path, "wb") as handle:
        handle.write(_graph().SerializeToString())
    code, out, _ = run_main(capsys, "convert", path, str(tmp_path / "out.pb"))
    assert code == 0
    weights = {node.name: node for node in read_graph(str(tmp_path / "out.pb")).node}
    assert len(weights["w"].attr["value"].tensor.tensor_content) == 32 * 16 * 2
    assert weights["w"].attr["dtype"].type == HALF
