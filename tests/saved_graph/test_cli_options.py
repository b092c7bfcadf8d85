"""Exclusions by op type and by name, inclusions, the list environment variables, --validate,
refusing converted graphs, and --dot."""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import saved_graph_models as models
from cli_helpers import FLOAT, HALF, node_types, read_graph, run_main

from tfamp_rewrite.doctor import heal_files


@pytest.fixture()
def frozen(tmp_path):
    return models.frozen_net(str(tmp_path / "net.pb"))


def _convert(capsys, source, output, *extra):
    code, out, err = run_main(capsys, "convert", source, str(output), *extra)
    assert code == 0, err
    return node_types(read_graph(str(output))), out


def _decisions(report_path):
    return {d["name"]: d for d in json.loads(open(report_path).read())["rewrite"]["decisions"]}


def test_op_types_to_exclude_keeps_those_ops_float32(frozen, tmp_path, capsys):
    report = tmp_path / "r.json"
    types, _ = _convert(capsys, frozen, tmp_path / "out.pb", "--op-types-to-exclude", "Conv2D,BiasAdd",
                        "--report", str(report))
    assert types["conv0/Conv2D"][1] == types["conv1/Conv2D"][1] == FLOAT
    assert types["dense/MatMul"][1] == HALF
    assert _decisions(report)["conv0/Conv2D"]["reason"] == "excluded: op type Conv2D"


def test_nodes_to_exclude_matches_names_from_the_start(frozen, tmp_path, capsys):
    report = tmp_path / "r.json"
    types, _ = _convert(capsys, frozen, tmp_path / "out.pb", "--nodes-to-exclude", "conv1/",
                        "--nodes-to-exclude", "Conv2D", "--report", str(report))  # the second matches nothing
    assert types["conv1/Conv2D"][1] == FLOAT
    assert types["conv0/Conv2D"][1] == HALF
    data = json.loads(report.read_text())
    assert "conv1/Conv2D" in data["excluded_nodes"] and "conv0/Conv2D" not in data["excluded_nodes"]
    assert any("'Conv2D' matches no node" in warning for warning in data["warnings"])


@pytest.mark.parametrize("kind", ["savedmodel", "metagraph"])
def test_nodes_the_training_run_healed_stay_float32_and_say_why(kind, tmp_path, capsys):
    """A heal file beside the checkpoint (a SavedModel's variables/, a MetaGraph's
    directory), as training sessions write it, keeps its nodes float32 in the conversion."""
    if kind == "savedmodel":
        source = models.saved_model(str(tmp_path / "in"))
        heals = os.path.join(source, "variables", heal_files.HEALS_BESIDE_CHECKPOINTS)
        output = tmp_path / "out"
    else:
        os.makedirs(str(tmp_path / "in"))
        source = models.meta_graph(str(tmp_path / "in"))
        heals = str(tmp_path / "in" / heal_files.HEALS_BESIDE_CHECKPOINTS)
        output = tmp_path / "out.meta"
    report = tmp_path / "r.json"
    code, _, err = run_main(capsys, "convert", source, str(output), "--report", str(report))
    assert code == 0, err
    assert _decisions(report)["conv1/Conv2D"]["dtype"] == "float16"  # converted without the file
    heal_files.write_heal_file(heals, ["conv1/Conv2D", "not/in/this/graph"], [])
    code, out, err = run_main(capsys, "convert", source, str(output), "--report", str(report),
                              "--overwrite")
    assert code == 0, err
    decision = _decisions(report)["conv1/Conv2D"]
    assert decision["dtype"] == "float32" and decision["rule"] == "healed_in_training"
    assert decision["reason"] == "kept float32: the training run that saved this model healed it (%s)" % heals
    assert _decisions(report)["conv0/Conv2D"]["dtype"] == "float16"
    assert "1 node(s) kept float32 that the training run healed" in out
    with open(heals, "w") as damaged:
        damaged.write("{")
    other = tmp_path / ("other" if kind == "savedmodel" else "other.meta")
    code, _, err = run_main(capsys, "convert", source, str(other), "--report", str(report))
    assert code == 2 and len(err.strip().splitlines()) == 1 and not other.exists()
    assert "cannot be read as the nodes its training run kept float32" in err and "Delete it" in err


def test_op_types_to_include_converts_a_deny_op(tmp_path, capsys):
    source = models.write_frozen(models.explain_graph(), str(tmp_path / "g.pb"))
    before, _ = _convert(capsys, source, tmp_path / "a.pb")
    after, _ = _convert(capsys, source, tmp_path / "b.pb", "--op-types-to-include", "Exp")
    assert before["exp"][1] == FLOAT
    assert after["exp"][1] == HALF


def test_list_environment_variables_reach_the_rewrite(frozen, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE", "MatMul")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD", "MatMul")
    types, _ = _convert(capsys, frozen, tmp_path / "out.pb")
    assert types["dense/MatMul"][1] == FLOAT
    assert types["conv0/Conv2D"][1] == HALF


def test_validate_passes_and_reports_errors_and_top1(frozen, tmp_path, capsys):
    report = tmp_path / "r.json"
    _, out = _convert(capsys, frozen, tmp_path / "out.pb", "--validate", "--report", str(report))
    validation = json.loads(report.read_text())["validation"]
    assert validation["passed"] is True
    (probs,) = validation["outputs"]
    assert probs["name"] == "probs" and probs["top1_agreement"] == 1.0
    assert 0 < probs["max_abs_error"] < 5e-2
    assert "max abs err" in out and "passed" in out


def test_validate_fails_beyond_tolerance_and_writes_nothing(frozen, tmp_path, capsys):
    output, report = tmp_path / "out.pb", tmp_path / "r.json"
    code, out, err = run_main(capsys, "convert", frozen, str(output), "--validate", "--rtol", "1e-7",
                              "--atol", "1e-9", "--report", str(report))
    assert code == 1
    assert not output.exists() and not [name for name in os.listdir(tmp_path) if ".tmp-" in name]
    assert "validation failed" in err and "--rtol/--atol" in err and len(err.strip().splitlines()) == 1
    assert "beyond tolerance" in out
    data = json.loads(report.read_text())
    assert data["output"] is None and data["validation"]["passed"] is False


def test_validate_with_input_data_catches_half_overflow(frozen, tmp_path, capsys):
    source = frozen
    inputs = models.overflow_inputs(str(tmp_path / "inputs.npz"))
    report = tmp_path / "r.json"
    code, out, _ = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--validate",
                            "--input-data", inputs, "--atol", "1e9", "--rtol", "1e9", "--report", str(report))
    assert code == 1  # even huge tolerances do not excuse inf
    (probs,) = json.loads(report.read_text())["validation"]["outputs"]
    assert probs["nonfinite"] > 0 and "non-finite" in out


@pytest.mark.parametrize("kind", ["frozen", "savedmodel"])
def test_validate_emulates_tensor_cores_without_a_gpu_and_says_so(kind, tmp_path, capsys):
    """Default --numerics auto: emulated here (no GPU); native runs this CPU's half kernels.
    The written graph is the same either way, and no emulated copy is left behind."""
    if kind == "frozen":
        source, outputs = models.frozen_net(str(tmp_path / "net.pb")), ("a.pb", "b.pb")
    else:
        source, outputs = models.saved_model(str(tmp_path / "model")), ("a", "b")
    results = {}
    for numerics, output in zip(("auto", "native"), outputs):
        report = tmp_path / ("%s.json" % numerics)
        code, out, err = run_main(capsys, "convert", source, str(tmp_path / output), "--validate",
                                  "--numerics", numerics, "--report", str(report))
        assert code == 0, err
        results[numerics] = (json.loads(report.read_text())["validation"], out)
    emulated, out = results["auto"]
    assert emulated["numerics"] == "emulate" and "no GPU is visible" in emulated["numerics_reason"]
    assert "half nodes ran emulated (no GPU is visible" in out
    assert (emulated["rtol"], emulated["atol"]) == (1e-2, 1e-2)
    native, out = results["native"]
    assert native["numerics"] == "native" and "native half kernels" in out
    assert (native["rtol"], native["atol"]) == (5e-2, 5e-2)
    first, second = (tmp_path / name for name in outputs)
    if kind == "frozen":
        assert first.read_bytes() == second.read_bytes()
    else:
        assert (first / "saved_model.pb").read_bytes() == (second / "saved_model.pb").read_bytes()
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]


@pytest.mark.parametrize("kind", ["frozen", "savedmodel", "metagraph"])
def test_validation_rounds_with_the_op_where_it_loads_and_agrees_with_casts(kind, tmp_path, capsys,
                                                                             monkeypatch):
    """The emulated copy rounds with RoundToHalf nodes (loaded with each format's loader);
    with the library disabled, with Cast pairs -- and the comparison comes out the same."""
    from tfamp_rewrite.fused_op import op as fused_op
    from tfamp_rewrite.fused_op import round_to_half as rounding

    source = {"frozen": lambda: models.frozen_net(str(tmp_path / "net.pb")),
              "savedmodel": lambda: models.saved_model(str(tmp_path / "model")),
              "metagraph": lambda: models.meta_graph(str(tmp_path / "model"))}[kind]()
    results = {}
    for library in ("loaded", "disabled"):
        if library == "disabled":
            monkeypatch.setenv(fused_op.DISABLE_ENV, "1")
        monkeypatch.setattr(fused_op, "_LOADER", fused_op._OpLoader())
        monkeypatch.setattr(rounding, "_CHOICE", rounding._RoundingChoice())
        report = tmp_path / ("%s.json" % library)
        output = tmp_path / (library + {"frozen": ".pb", "metagraph": ".meta"}.get(kind, ""))
        code, _, err = run_main(capsys, "convert", source, str(output), "--validate", "--report", str(report))
        assert code == 0, err
        results[library] = json.loads(report.read_text())["validation"]
    with_op, with_casts = results["loaded"], results["disabled"]
    assert with_op["numerics"] == with_casts["numerics"] == "emulate"
    assert re.search(r"; rounding by [1-9][0-9]* RoundToHalf op\(s\)$", with_op["numerics_reason"])
    assert with_casts["numerics_reason"].endswith("rounding by Cast pairs")
    assert with_op["outputs"] == with_casts["outputs"] and with_op["passed"]


def test_converted_graph_is_refused_unless_forced(frozen, tmp_path, capsys):
    first = tmp_path / "once.pb"
    _convert(capsys, frozen, first)
    code, _, err = run_main(capsys, "convert", str(first), str(tmp_path / "twice.pb"))
    assert code == 2
    assert "is already converted" in err and "--force" in err and "'conv0/Conv2D'" in err
    report = tmp_path / "r.json"
    types, _ = _convert(capsys, str(first), tmp_path / "twice.pb", "--force", "--report", str(report))
    assert types == node_types(read_graph(str(first)))  # rewriting a rewritten graph changes nothing
    assert json.loads(report.read_text())["rewrite"]["casts_added"] == 0


def test_overwrite_replaces_a_saved_model_directory(tmp_path, capsys):
    source = models.saved_model(str(tmp_path))
    output = tmp_path / "out"
    shutil.copytree(source, output)  # an earlier conversion, say
    (output / "stale.txt").write_text("old")
    code, _, err = run_main(capsys, "convert", source, str(output), "--overwrite")
    assert code == 0, err
    assert sorted(os.listdir(output)) == ["saved_model.pb", "variables"]
    assert sorted(os.listdir(tmp_path)) == ["out", "saved_model"]  # no backup or temporary left


def test_dot_draws_the_painted_graph_and_a_neighbourhood(frozen, tmp_path, capsys):
    whole, around = tmp_path / "whole.dot", tmp_path / "around.dot"
    _convert(capsys, frozen, tmp_path / "a.pb", "--dot", str(whole))
    _convert(capsys, frozen, tmp_path / "b.pb", "--dot", str(around), "--node", "dense/MatMul",
             "--radius", "1")
    text, small = whole.read_text(), around.read_text()
    assert text.startswith("digraph") and '"conv0/Conv2D" [label="conv0/Conv2D\\nConv2D (float16)"' in text
    assert "#ffe599" in text  # the boundary Cast of the input
    drawn = {line.split('"')[1] for line in small.splitlines() if "[label=" in line}
    converted = read_graph(str(tmp_path / "b.pb"))
    matmul = next(node for node in converted.node if node.name == "dense/MatMul")
    consumers = {node.name for node in converted.node
                 if any(text.split(":")[0] == "dense/MatMul" for text in node.input)}
    assert drawn == {"dense/MatMul"} | set(matmul.input) | consumers  # radius 1
    assert "pool-0-CastToFp16-0-AutoMixedPrecision" in drawn and "logits" in drawn
    if shutil.which("dot"):
        with open(str(tmp_path / "around.png"), "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_clamp_and_keep_float32_rules_for_out_of_range_constants(tmp_path, capsys):
    source = models.write_frozen(models.constants_graph(), str(tmp_path / "c.pb"))
    kept, _ = _convert(capsys, source, tmp_path / "kept.pb")
    clamped, out = _convert(capsys, source, tmp_path / "clamped.pb", "--out-of-range", "clamp")
    assert kept["scaled"][1] == FLOAT and kept["big"] == ("Const", FLOAT)
    assert clamped["scaled"][1] == HALF and clamped["big"] == ("Const", HALF)
    big = next(n for n in read_graph(str(tmp_path / "clamped.pb")).node if n.name == "big")
    stored = np.array(big.attr["value"].tensor.half_val, np.uint16).view(np.float16)
    assert stored.tolist() == [65504.0]
    assert "warning: constant 'big' does not fit float16" in out and "clamped" in out


def test_outputs_get_the_mode_new_files_get_under_the_umask(frozen, tmp_path, capsys):
    """Outputs are staged in private temporary files: renamed into place, they must be
    readable as any new file would be (a serving process often runs as another user)."""
    previous = os.umask(0o022)
    try:
        report = tmp_path / "r.json"
        _convert(capsys, frozen, tmp_path / "out.pb", "--report", str(report))
        saved = models.saved_model(str(tmp_path / "in"))
        code, _, err = run_main(capsys, "convert", saved, str(tmp_path / "sm"))
        assert code == 0, err
    finally:
        os.umask(previous)
    assert (tmp_path / "out.pb").stat().st_mode & 0o777 == 0o644
    assert report.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "sm").stat().st_mode & 0o777 == 0o755


def test_a_text_output_is_labelled_text(frozen, tmp_path, capsys):
    code, out, err = run_main(capsys, "convert", frozen, str(tmp_path / "out.pbtxt"))
    assert code == 0, err
    assert "wrote %s: GraphDef (text)" % (tmp_path / "out.pbtxt") in out
    assert (tmp_path / "out.pbtxt").read_text().startswith("node {")


def test_validation_inputs_of_the_wrong_shape_are_a_one_line_user_error(frozen, tmp_path, capsys):
    images = np.zeros([2, 3, 3, 1], np.float32)  # the net takes [None, 8, 8, 3]
    np.savez(str(tmp_path / "in.npz"), images=images)
    code, _, err = run_main(capsys, "convert", frozen, str(tmp_path / "out.pb"), "--validate",
                            "--input-data", str(tmp_path / "in.npz"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "takes shape" in err and "[2, 3, 3, 1]" in err and "internal error" not in err
    assert not (tmp_path / "out.pb").exists()


def test_an_op_type_that_matches_nothing_suggests_the_graphs_spelling(frozen, tmp_path, capsys):
    _, out = _convert(capsys, frozen, tmp_path / "out.pb", "--op-types-to-exclude", "conv2d,MatMull,Zzz")
    said = capsys.readouterr()
    lines = [line for line in (out + said.out + said.err).splitlines() if "the graph has no op" in line]
    assert any("conv2d" in line and "did you mean Conv2D?" in line for line in lines), lines
    assert any("MatMull" in line and "did you mean MatMul?" in line for line in lines), lines
    assert any("Zzz" in line and "did you mean" not in line for line in lines), lines


def test_integer_outputs_are_outputs_and_are_validated(tmp_path, capsys):
    """A deployment graph ending in an argmax (class ids), beside a float32 output: both are
    the default outputs, and validation compares both."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        logits = tf.matmul(x, tf.constant(np.eye(8, 3, dtype=np.float32)), name="logits")
        tf.argmax(logits, 1, name="classes")
        tf.nn.softmax(logits, name="probs")
    source = models.write_frozen(graph.as_graph_def(), str(tmp_path / "classifier.pb"))
    report = tmp_path / "report.json"
    code, out, err = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--validate",
                              "--report", str(report))
    assert code == 0, err
    compared = {o["name"]: o for o in json.loads(report.read_text())["validation"]["outputs"]}
    assert set(compared) == {"classes", "probs"} and compared["classes"]["dtype"] == "int64"
    only_classes = tf.Graph()
    with only_classes.as_default():
        tf1.import_graph_def(graph.as_graph_def(), name="")
    source = models.write_frozen(tf1.graph_util.extract_sub_graph(
        only_classes.as_graph_def(), ["classes"]), str(tmp_path / "ids_only.pb"))
    code, out, err = run_main(capsys, "convert", source, str(tmp_path / "ids.pb"), "--validate")
    assert code == 0, err
    assert re.search(r"^\s+classes\s+int64\s+0\s+0\s+-\s+ok$", out, re.M)
