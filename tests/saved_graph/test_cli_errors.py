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
    return [
        ("missing_file", str(root / "nope.pb"), [], ["does not exist"]),
        ("not_a_graph", str(not_a_graph), [], ["is not a GraphDef", "SavedModel, pass its directory"]),
        ("truncated_protobuf", str(truncated), [],
         ["looks truncated", "parse failed at byte", "of %d" % truncated.stat().st_size, "export it again"]),
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
