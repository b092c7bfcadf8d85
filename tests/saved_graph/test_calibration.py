"""convert --calibration-data and --auto-tune on frozen graphs with one planted float16-hostile spot.

Validation runs emulated (no GPU here: the default), so the results are the same on every CPU.
"""
from __future__ import annotations

import json

import doctor_graphs
import jsonschema
import numpy as np
import pytest
import saved_graph_models as models
from cli_helpers import read_graph, run_main

from tfamp_rewrite.graph_rewrite.graph_view import topological_names
from tfamp_rewrite.saved_graph import report_schema
from tfamp_rewrite.saved_graph.auto_tune import search
from tfamp_rewrite.saved_graph.calibration import calibration_batches
from tfamp_rewrite.saved_graph.graph_io import GraphTensor

VALIDATOR = jsonschema.Draft7Validator(report_schema.SCHEMA)
HALF, FLOAT = 19, 1


def dtypes(path):
    return {node.name: node.attr["T"].type for node in read_graph(path).node if "T" in node.attr}


@pytest.fixture
def overflow(tmp_path):
    source = models.write_frozen(doctor_graphs.overflow_graph(), str(tmp_path / "in.pb"))
    data = str(tmp_path / "inputs.npz")
    np.savez(data, x=doctor_graphs.inputs(100.0))  # mm1 in the hundreds: its square passes 65504
    return source, data, tmp_path


def test_plain_conversion_overflows_and_calibration_keeps_the_square_float32(overflow, capsys):
    source, data, tmp_path = overflow
    output, report = str(tmp_path / "out.pb"), tmp_path / "report.json"
    code, _, err = run_main(capsys, "convert", source, output, "--validate", "--input-data", data, "-q")
    assert code == 1 and "validation failed" in err
    code, out, err = run_main(capsys, "convert", source, output, "--validate", "--input-data", data,
                              "--calibration-data", data, "--report", str(report))
    assert code == 0, err
    written = json.loads(report.read_text())
    VALIDATOR.validate(written)
    kept = {node["name"]: node for node in written["calibration"]["kept"]}
    # the square and the Mul that reads it (it would read it through a Cast to half)
    assert set(kept) == {"square", "rescale"} and all(n["rule"] == "calibration" for n in kept.values())
    assert "overflow float16" in kept["square"]["reason"] and "square:0" in kept["rescale"]["reason"]
    assert [r["tensor"] for r in written["calibration"]["at_risk"]] == ["square:0"]
    decisions = {d["name"]: d for d in written["rewrite"]["decisions"]}
    assert decisions["square"]["reason"].startswith("kept float32 by calibration")
    assert dtypes(output)["square"] == FLOAT and dtypes(output)["mm1"] == dtypes(output)["mm2"] == HALF
    assert written["validation"]["passed"] and "kept square (Mul)" in out


def test_calibration_data_the_graph_cannot_run_on_is_named_with_tensorflows_reason(tmp_path, capsys):
    """An embedding index beyond the vocabulary: TensorFlow's reason, not its first line
    ("Graph execution error:"), and nothing written."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [None, 5], name="ids")
        table = tf.constant(np.ones([10, 8], np.float32))
        hidden = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), 1)
        tf.nn.softmax(tf.matmul(hidden, tf.ones([8, 3])), name="probs")
    source = models.write_frozen(graph.as_graph_def(), str(tmp_path / "embedding.pb"))
    data, output = str(tmp_path / "ids.npz"), tmp_path / "out.pb"
    np.savez(data, ids=np.full([4, 5], 12, np.int32))
    code, _, err = run_main(capsys, "convert", source, str(output), "--calibration-data", data)
    assert code == 2 and not output.exists()
    (line,) = [line for line in err.splitlines() if line.startswith("tfamp-rewrite:")]
    assert "failed to run on %s: indices[0,0] = 12 is not in [0, 10)" % data in line


def test_thresholds_decide_what_is_at_risk(overflow, capsys):
    source, data, tmp_path = overflow
    code, _, err = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--calibration-data", data,
                            "--overflow-threshold", "0.5", "--report", str(tmp_path / "r.json"))
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["calibration"]["kept"] == []
    code, _, err = run_main(capsys, "convert", source, str(tmp_path / "x.pb"), "--flush-threshold", "0.5")
    assert code == 2 and "only used with --calibration-data or --auto-tune" in err


def test_auto_tune_keeps_only_the_cancelling_path_float32(tmp_path, capsys):
    source = models.write_frozen(doctor_graphs.cancellation_graph(), str(tmp_path / "in.pb"))
    output, report = str(tmp_path / "out.pb"), tmp_path / "report.json"
    code, _, err = run_main(capsys, "convert", source, output, "--validate", "-q")
    assert code == 1  # mm1 + 1000 - 1000 in half: mm1's digits are gone
    code, out, err = run_main(capsys, "convert", source, output, "--auto-tune", "--report", str(report))
    assert code == 0, err
    written = json.loads(report.read_text())
    VALIDATOR.validate(written)
    tuning = written["auto_tune"]
    assert tuning["passed"] and written["validation"]["passed"]
    assert written["calibration"]["kept"] == []           # no value overflows or flushes here
    assert {n["name"] for n in tuning["kept"]} <= {"shift", "unshift"} and tuning["kept"]
    assert all(n["rule"] == "auto_tune" and "rtol=0.01" in n["reason"] for n in tuning["kept"])
    kinds = dtypes(output)
    assert kinds["shift"] == kinds["unshift"] == FLOAT           # the path stays float32
    assert kinds["mm1"] == kinds["mm2"] == HALF                  # the MatMuls still run in half
    assert not tuning["trials"][0]["passed"] and tuning["trials"][-1]["passed"] is not None
    assert "Auto-tune (rtol=0.01, atol=0.01): passed" in out


def test_search_finds_the_culprits_by_bisection():
    culprits = {"n3", "n7"}
    candidates = ["n%d" % i for i in range(12)]
    asked = []

    def passes(kept, what):
        asked.append(what)
        return culprits <= set(kept), None

    kept, trials, passed = search([], candidates, passes)
    assert passed and set(kept) == culprits and len(trials) == len(asked) < 2 * len(candidates)
    kept, trials, passed = search(["n3"], candidates, passes)
    assert passed and kept == ["n7"]
    kept, trials, passed = search([], candidates, passes, max_trials=3)
    assert len(trials) == 3 and culprits <= set(kept)           # out of trials: a set known to pass


def test_topological_order_and_calibration_batches():
    order = topological_names(doctor_graphs.cancellation_graph())
    assert order.index("mm1") < order.index("shift") < order.index("unshift") < order.index("mm2")
    fixed = [GraphTensor("x", "x:0", "float32", shape=[4, 16])]
    unknown = [GraphTensor("x", "x:0", "float32", shape=[None, 16])]
    data = {"x": np.zeros([12, 16], np.float32)}
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".npz") as handle:
        np.savez(handle.name, **data)
        assert [b[0].shape for b in calibration_batches(handle.name, fixed)] == [(4, 16)] * 3
        assert [b[0].shape for b in calibration_batches(handle.name, unknown)] == [(12, 16)]
