"""Bad input never gets a traceback: one stderr line naming the problem and the fix, exit
status 2, nothing written, the input untouched."""
from __future__ import annotations

import os
import shutil

import pytest
import saved_graph_models as models
from cli_helpers import digest, run_cli, run_main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    frozen = models.frozen_net(str(root / "net.pb"))
    saved_model = models.saved_model(str(root))
    return {"root": root, "frozen": frozen, "saved_model": saved_model}


def _bad_inputs(files, tmp_path):
    """(case name, INPUT path, extra arguments, words the message must contain)."""
    root = files["root"]
    with open(files["frozen"], "rb") as handle:
        frozen_bytes = handle.read()
    truncated = tmp_path / "truncated.pb"
    truncated.write_bytes(frozen_bytes[: len(frozen_bytes) * 2 // 3])
    not_a_graph = tmp_path / "notes.pb"
    not_a_graph.write_bytes(b"these are not the graphs you are looking for\n" * 20)
    saved_model_as_pb = tmp_path / "model.pb"
    shutil.copy(os.path.join(files["saved_model"], "saved_model.pb"), saved_model_as_pb)
    graph_as_meta = tmp_path / "graph.meta"
    shutil.copy(files["frozen"], graph_as_meta)
    text_as_binary = tmp_path / "text.pb"
    models.write_frozen(models.explain_graph(), str(text_as_binary), text=True)
    plain_directory = tmp_path / "plain"
    plain_directory.mkdir()
    text = tmp_path / "whole.pbtxt"
    models.write_frozen(models.explain_graph(), str(text), text=True)
    truncated_text = tmp_path / "truncated.pbtxt"
    truncated_text.write_bytes(text.read_bytes()[: text.stat().st_size * 2 // 3])
    return [
        ("missing_file", str(root / "nope.pb"), [], ["does not exist"]),
        ("not_a_graph", str(not_a_graph), [], ["is not a GraphDef", "SavedModel, pass its directory"]),
        ("truncated_protobuf", str(truncated), [],
         ["looks truncated", "parse failed at byte", "of %d" % truncated.stat().st_size, "export it again"]),
        ("truncated_text", str(truncated_text), [],
         ["looks truncated", "in its last line", "export it again"]),
        ("saved_model_named_pb", str(saved_model_as_pb), [], ["holds a binary SavedModel", "directory"]),
        ("graph_def_named_meta", str(graph_as_meta), [], ["holds a binary GraphDef", "Rename it to", ".pb"]),
        ("text_named_pb", str(text_as_binary), [], ["holds a text GraphDef, not the binary GraphDef",
                                                    "Rename it to", ".pbtxt"]),
        ("directory_not_saved_model", str(plain_directory), [], ["not a SavedModel"]),
        ("unknown_tag_set", files["saved_model"], ["--tag-set", "gpu"], ["no MetaGraph with tag set 'gpu'",
                                                                        "it has serve", "--tag-set"]),
        ("unknown_signature", files["saved_model"], ["--signature-def", "classify"],
         ["no signature 'classify'", "logits_only, serving_default", "--signature-def"]),
        ("unknown_output", files["frozen"], ["--outputs", "prob"], ["'prob' is not a node", "probs"]),
        ("io_names_on_saved_model", files["saved_model"], ["--outputs", "probs"], ["signatures"]),
        ("bad_regex", files["frozen"], ["--nodes-to-exclude", "conv[0"], ["not a regular expression"]),
        ("input_data_without_validate", files["frozen"], ["--input-data", "x.npz"], ["--validate"]),
    ]


def _assert_one_line_error(code, err, words):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tfamp-rewrite: ")
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0]


def test_every_bad_input_is_one_line_exit_2_and_writes_nothing(files, tmp_path, capsys):
    cases = _bad_inputs(files, tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for name, source, extra, words in cases:
        output = str(out_dir / ("converted" if os.path.isdir(source) or "saved_model" in source
                                else "converted" + os.path.splitext(source)[1]))
        before = digest(source) if os.path.exists(source) else None
        code, _, err = run_main(capsys, "convert", source, output, *extra)
        try:
            _assert_one_line_error(code, err, words)
        except AssertionError as error:
            raise AssertionError("case %s: %s" % (name, error)) from None
        assert os.listdir(out_dir) == [], name  # no output, no temporary file
        if before is not None:
            assert digest(source) == before, name


def test_unknown_extension_is_named(files, tmp_path, capsys):
    source = tmp_path / "model.onnx"
    shutil.copy(files["frozen"], source)
    code, _, err = run_main(capsys, "convert", str(source), str(tmp_path / "out.onnx"))
    _assert_one_line_error(code, err, ["unknown extension '.onnx'", ".pbtxt", "SavedModel directory"])


@pytest.mark.parametrize("case", ["output_exists", "parent_is_a_file", "parent_missing",
                                  "read_only_directory", "output_is_input", "output_extension_differs",
                                  "saved_model_to_file"])
def test_bad_outputs(case, files, tmp_path, capsys):
    source = files["saved_model"] if case == "saved_model_to_file" else files["frozen"]
    existing = tmp_path / "existing.pb"
    existing.write_bytes(b"keep me")
    a_file = tmp_path / "file"
    a_file.write_bytes(b"")
    output, words = {
        "output_exists": (str(existing), ["already exists", "--overwrite"]),
        "parent_is_a_file": (str(a_file / "out.pb"), ["is not a directory"]),
        "parent_missing": (str(tmp_path / "missing" / "out.pb"), ["does not exist", "mkdir"]),
        "read_only_directory": ("/sys/converted.pb", ["cannot write to /sys", "writable directory"]),
        "output_is_input": (source, ["is (inside) the INPUT"]),
        "output_extension_differs": (str(tmp_path / "out.meta"), ["does not end in .pb or .pbtxt"]),
        "saved_model_to_file": (str(tmp_path / "out.pb"), ["INPUT is a SavedModel", "directory path"]),
    }[case]
    if case == "read_only_directory" and not os.path.isdir("/sys"):
        pytest.skip("no read-only /sys on this machine")
    before, listing = digest(source), sorted(os.listdir(tmp_path))
    code, _, err = run_main(capsys, "convert", source, output)
    _assert_one_line_error(code, err, words)
    assert digest(source) == before
    assert sorted(os.listdir(tmp_path)) == listing
    assert existing.read_bytes() == b"keep me"


def test_bad_side_outputs_are_refused_before_converting(files, tmp_path, capsys):
    output = tmp_path / "out.pb"
    code, _, err = run_main(capsys, "convert", files["frozen"], str(output), "--report",
                            str(tmp_path / "missing" / "report.json"))
    _assert_one_line_error(code, err, ["--report", "does not exist"])
    assert not output.exists()


def _copy_of(files, tmp_path, name):
    """A copy of an input under ``tmp_path`` (the tests below must not touch the module's)."""
    source = files["saved_model"] if name == "saved_model" else files["frozen"]
    target = tmp_path / ("sm" if name == "saved_model" else "net.pb")
    (shutil.copytree if name == "saved_model" else shutil.copy)(source, target)
    return str(target)


@pytest.mark.parametrize("command", ["convert", "explain"])
@pytest.mark.parametrize("option,target", [("--report", "input"), ("--report", "inside the input"),
                                           ("--dot", "input"), ("--report", "output"),
                                           ("--dot", "output"), ("--dot", "the report")])
def test_side_outputs_never_land_on_the_input_the_output_or_each_other(files, tmp_path, capsys, command,
                                                                       option, target):
    kind = "saved_model" if target == "inside the input" else "frozen"
    source = _copy_of(files, tmp_path, kind)
    output = str(tmp_path / ("converted" if kind == "saved_model" else "converted.pb"))
    path = {"input": source, "inside the input": os.path.join(source, "saved_model.pb"),
            "output": output, "the report": str(tmp_path / "report.json")}[target]
    if command == "explain" and target in ("output",):
        pytest.skip("explain writes no OUTPUT")
    arguments = [command, source] + ([output] if command == "convert" else []) + [option, path]
    if target == "the report":
        arguments += ["--report", path]
    before, listing = digest(source), sorted(os.listdir(tmp_path))
    code, _, err = run_main(capsys, *arguments)
    words = {"input": ["would write over the INPUT"], "inside the input": ["would write over the INPUT"],
             "output": ["would write over OUTPUT"], "the report": ["would write over --"]}[target]
    _assert_one_line_error(code, err, words)
    assert digest(source) == before
    assert sorted(os.listdir(tmp_path)) == listing


def test_an_output_holding_the_input_is_refused(files, tmp_path, capsys):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    source = shutil.copytree(files["saved_model"], models_dir / "sm")
    (models_dir / "NOTES.txt").write_text("keep me")
    code, _, err = run_main(capsys, "convert", str(source), str(models_dir), "--overwrite")
    _assert_one_line_error(code, err, ["holds the INPUT", "outside it"])
    assert (models_dir / "NOTES.txt").read_text() == "keep me" and (source / "saved_model.pb").exists()


def test_overwrite_replaces_only_a_saved_model_directory(files, tmp_path, capsys):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    code, _, err = run_main(capsys, "convert", files["saved_model"], str(project), "--overwrite")
    _assert_one_line_error(code, err, ["holds no SavedModel", "--overwrite only replaces a SavedModel"])
    assert (project / "src" / "main.py").read_text() == "print('mine')\n"


def _frozen_with(tmp_path, edit):
    """A small frozen graph ``x -> MatMul -> y`` after ``edit(graph_def)``, written to a .pb."""
    import numpy as np
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        tf.identity(tf.matmul(x, tf.constant(np.ones([4, 2], np.float32)), name="mm"), name="y")
    graph_def = graph.as_graph_def()
    edit(graph_def)
    path = tmp_path / "edited.pb"
    path.write_bytes(graph_def.SerializeToString())
    return str(path)


def _set(graph_def, name, **fields):
    node = next(node for node in graph_def.node if node.name == name)
    for key, value in fields.items():
        setattr(node, key, value)


@pytest.mark.parametrize("case", ["device_missing_here", "op_not_registered"])
def test_validation_says_what_tensorflow_said(tmp_path, capsys, case):
    """A graph this process cannot load or run is the user's input, not an internal error: one
    line with TensorFlow's own reason (not TensorFlow 2's "Graph execution error:" header)."""
    edit = {"device_missing_here": lambda g: _set(g, "mm", device="/device:CPU:9"),
            "op_not_registered": lambda g: _set(g, "y", op="MyCustomActivation")}[case]
    source = _frozen_with(tmp_path, edit)
    code, _, err = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--validate",
                            "--outputs", "y")
    words = {"device_missing_here": ["the original graph failed to run", "Cannot assign a device",
                                     "drop --validate"],
             "op_not_registered": ["does not load for validation here",
                                   "Op type not registered 'MyCustomActivation'", "drop --validate"]}[case]
    _assert_one_line_error(code, err, words)
    assert "internal error" not in err and "Graph execution error" not in err and "--target cpu" not in err
    assert not (tmp_path / "out.pb").exists()


def test_argument_errors_are_one_line(files, tmp_path, capsys):
    code, _, err = run_main(capsys, "convert", files["frozen"], str(tmp_path / "o.pb"), "--dtype", "float8")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "invalid choice: 'float8'" in err and "--help" in err


def test_console_script_error_has_no_traceback(tmp_path):
    result = run_cli("convert", str(tmp_path / "missing.pb"), str(tmp_path / "out.pb"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "tfamp-rewrite: %s does not exist. Check the path (INPUT is a .pb, .pbtxt or .meta file or "
        "a SavedModel directory)" % (tmp_path / "missing.pb")]
    assert os.listdir(tmp_path) == []
