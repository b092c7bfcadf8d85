"""Invalid graphs are refused before the rewrite: one line naming the node and the problem, exit
status 2, nothing written, the input untouched.  Unregistered ops stay float32 boundaries.

Each case damages one thing of a valid graph the way a bad exporter, a hand edit or a
damaged file would, and runs ``cli.main`` in this process.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import saved_graph_models as models
import tensorflow as tf
from cli_helpers import digest, read_graph, run_main
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import function

from tfamp_rewrite.saved_graph import conversion

tf1 = tf.compat.v1
DT_INT16, DT_INT32, DT_INT64, DT_DOUBLE = 5, 3, 9, 2


def _node(graph_def, name):
    return next(node for node in graph_def.node if node.name == name)


def _add_n_graph():
    """x -> AddN(x, x) -> IdentityN -> Concat with a number_attr and a type_list_attr."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        total = tf.add_n([x, x], name="total")
        both = tf.identity_n([total, x], name="both")
        tf.concat(both, axis=1, name="joined")
    return graph.as_graph_def()


def _edit(graph_def, name, change):
    edited = graph_pb2.GraphDef()
    edited.CopyFrom(graph_def)
    change(_node(edited, name))
    return edited


def _set(attr, **fields):
    def change(node):
        node.attr[attr].Clear()
        for key, value in fields.items():
            if key == "list_i":
                node.attr[attr].list.i.extend(value)
            else:
                setattr(node.attr[attr], key, value)
    return change


def _drop_attr(attr):
    return lambda node: node.attr.pop(attr)


def _drop_input(index):
    return lambda node: node.input.__delitem__(index)


def _const_content(size):
    def change(node):
        node.attr["value"].tensor.tensor_content = b"\0" * size
    return change


def _retype_const(node):
    node.attr["dtype"].type = DT_INT32


def _rename_op(op):
    def change(node):
        node.op = op
    return change


def _control_first(node):
    node.input.insert(0, "^x")


def _read_port(node):
    node.input[0] = "x:3"


EXPLAIN = models.explain_graph()
ADD_N = _add_n_graph()
# (case, graph, words the one line must hold); each graph is EXPLAIN or ADD_N with one edit.
INVALID = [
    ("missing_attr", _edit(EXPLAIN, "mm", _drop_attr("T")), ["node 'mm' (MatMul) lacks attr 'T' (type)"]),
    ("empty_attr_value", _edit(EXPLAIN, "relu", _set("T")), ["node 'relu' (Relu) attr 'T' has no value"]),
    ("dt_invalid", _edit(EXPLAIN, "relu", _set("T", type=0)), ["'relu'", "attr 'T' is DT_INVALID"]),
    ("type_not_allowed", _edit(EXPLAIN, "mm", _set("T", type=DT_INT16)),
     ["'mm' (MatMul) attr 'T' is int16, not one of the allowed", "float16, float32"]),
    ("string_not_allowed", _edit(EXPLAIN, "bias", _set("data_format", s=b"NHCW")),
     ["'bias' (BiasAdd) attr 'data_format' is 'NHCW', not one of the allowed 'NHWC', 'NCHW'"]),
    ("wrong_kind", _edit(EXPLAIN, "mm", _set("transpose_a", i=1)),
     ["attr 'transpose_a' holds int where bool is expected"]),
    ("input_count", _edit(EXPLAIN, "mm", _drop_input(1)),
     ["'mm' (MatMul) has 1 data input(s) but MatMul takes 2"]),
    ("number_attr", _edit(ADD_N, "total", _set("N", i=3)), ["'total' (AddN) has 2 data input(s)", "takes 3"]),
    ("huge_number_attr", _edit(ADD_N, "total", _set("N", i=2 ** 40)), ["takes %d" % 2 ** 40]),
    ("number_below_minimum", _edit(ADD_N, "total", _set("N", i=0)), ["attr 'N' is 0, below its minimum 1"]),
    ("type_list_attr", _edit(ADD_N, "both", _drop_input(1)),
     ["'both' (IdentityN) has 1 data input(s)", "takes 2"]),
    ("edge_dtype", _edit(EXPLAIN, "mm", _set("T", type=DT_DOUBLE)),
     ["'mm' (MatMul) input 0 ('x') is float32, but MatMul expects float64 there"]),
    ("missing_output", _edit(EXPLAIN, "mm", _read_port),
     ["'mm' (MatMul) reads 'x:3', but 'x' has 1 output(s)"]),
    ("control_before_data", _edit(EXPLAIN, "mm", _control_first),
     ["'mm' (MatMul) has data input 'x' after a control"]),
    ("const_content_size", _edit(EXPLAIN, "w", _const_content(10)),
     ["'w' (Const) attr 'value' has 10 bytes of content, but float32 [16,12] needs 768"]),
    ("const_dtype", _edit(EXPLAIN, "w", _retype_const),
     ["'w' (Const) declares dtype int32 but its value tensor is float32"]),
    ("op_typo", _edit(EXPLAIN, "softmax", _rename_op("Softmac")),
     ["node 'softmax' has op 'Softmac', which TensorFlow does not register", "one edit away from 'Softmax'",
      "--op-types-to-exclude Softmac"]),
    ("shape_function", _edit(EXPLAIN, "mm", _set("transpose_b", b=True)),
     ["TensorFlow %s cannot import it" % tf.__version__, "Dimensions must be equal", "node 'mm'"]),
]


def _assert_refused(capsys, source, output, words, *extra):
    before = digest(source)
    code, _, err = run_main(capsys, "convert", source, output, "--target", "cpu", *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("tfamp-rewrite: ") and "internal error" not in lines[0], lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not os.path.lexists(output)
    assert os.listdir(os.path.dirname(output)) == []
    assert digest(source) == before
    return lines[0]


@pytest.mark.parametrize("case,graph_def,words", INVALID, ids=[case[0] for case in INVALID])
def test_invalid_graphs_are_refused_in_one_line(case, graph_def, words, tmp_path, capsys):
    source = models.write_frozen(graph_def, str(tmp_path / "in.pb"))
    (tmp_path / "out").mkdir()
    line = _assert_refused(capsys, source, str(tmp_path / "out" / "out.pb"), words)
    assert "is not a valid graph" in line


def test_text_graphs_and_explain_are_checked_too(tmp_path, capsys):
    graph_def = INVALID[0][1]
    source = models.write_frozen(graph_def, str(tmp_path / "in.pbtxt"), text=True)
    (tmp_path / "out").mkdir()
    _assert_refused(capsys, source, str(tmp_path / "out" / "out.pbtxt"), ["lacks attr 'T'"])
    code, out, err = run_main(capsys, "explain", source)
    assert code == 2 and out == "" and err.count("\n") == 1 and "lacks attr 'T'" in err


def test_an_unregistered_op_stays_a_float32_boundary(tmp_path, capsys):
    """Documented behaviour: converted around, reported; TensorFlow imports the rest."""
    graph_def = _edit(EXPLAIN, "exp", _rename_op("MyCustomExp"))
    source = models.write_frozen(graph_def, str(tmp_path / "in.pb"))
    output = str(tmp_path / "out.pb")
    code, out, err = run_main(capsys, "convert", source, output, "--target", "cpu")
    assert code == 0, err
    assert "unknown op type(s) kept as float32 boundaries: MyCustomExp" in out
    converted = read_graph(output)
    assert _node(converted, "exp").op == "MyCustomExp" and _node(converted, "mm").attr["T"].type == 19


def test_a_custom_op_one_edit_from_a_registered_one_is_accepted_when_named(tmp_path, capsys):
    graph_def = _edit(EXPLAIN, "exp", _rename_op("Expm"))  # one edit from Exp and Expm1
    source = models.write_frozen(graph_def, str(tmp_path / "in.pb"))
    (tmp_path / "out").mkdir()
    output = str(tmp_path / "out" / "out.pb")
    _assert_refused(capsys, source, output, ["op 'Expm'", "'Exp' and 'Expm1'"])
    code, _, err = run_main(capsys, "convert", source, output, "--target", "cpu",
                            "--op-types-to-exclude", "Expm")
    assert code == 0, err
    assert _node(read_graph(output), "exp").op == "Expm"


def test_an_attr_the_op_does_not_define_is_a_warning(tmp_path, capsys):
    graph_def = _edit(EXPLAIN, "relu", _set("alpha", f=0.5))
    source = models.write_frozen(graph_def, str(tmp_path / "in.pb"))
    code, out, err = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--target", "cpu")
    assert code == 0, err
    assert "warning: node 'relu' (Relu) has attr 'alpha', which this TensorFlow's Relu does not define" in out


def _function_graph():
    @function.Defun(tf.float32, func_name="scaled_tanh")
    def scaled_tanh(x):
        return tf.tanh(x) * 2.0

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        scaled_tanh(tf.linalg.matmul(x, tf.ones([4, 4]), name="mm"), name="call")
    return graph.as_graph_def()


def test_function_bodies_are_checked(tmp_path, capsys):
    graph_def = _function_graph()
    body = graph_def.library.function[0]
    tanh = next(node for node in body.node_def if node.op == "Tanh")
    tanh.attr["T"].type = DT_INT16
    source = models.write_frozen(graph_def, str(tmp_path / "in.pb"))
    (tmp_path / "out").mkdir()
    _assert_refused(capsys, source, str(tmp_path / "out" / "out.pb"),
                    ["function 'scaled_tanh': node %r (Tanh) attr 'T' is int16" % tanh.name])


def test_a_valid_function_library_passes(tmp_path, capsys):
    source = models.write_frozen(_function_graph(), str(tmp_path / "in.pb"))
    code, _, err = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--target", "cpu")
    assert code == 0, err


# -- MetaGraphs and SavedModels ---------------------------------------------------------
@pytest.fixture(scope="module")
def saved_model_dir(tmp_path_factory):
    return models.saved_model(str(tmp_path_factory.mktemp("sm")))


def _damaged_saved_model(saved_model_dir, tmp_path, change):
    copy = str(tmp_path / "saved_model")
    shutil.copytree(saved_model_dir, copy)
    path = os.path.join(copy, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(path, "rb") as handle:
        saved_model.ParseFromString(handle.read())
    change(saved_model.meta_graphs[0])
    with open(path, "wb") as handle:
        handle.write(saved_model.SerializeToString())
    (tmp_path / "out").mkdir()
    return copy, str(tmp_path / "out" / "converted")


def _restore_names(meta_graph):
    names = _node(meta_graph.graph_def, "save/RestoreV2/tensor_names").attr["value"].tensor.string_val
    names[0] = b"conv0/kernal"


def _variable_dtype(meta_graph):
    _node(meta_graph.graph_def, "dense/bias").attr["dtype"].type = DT_INT64


def _signature_tensor(meta_graph):
    meta_graph.signature_def["serving_default"].inputs["images"].name = "imagez:0"


def _saver_tensor(meta_graph):
    meta_graph.saver_def.filename_tensor_name = "sav%/Const:0"


def _restore_reads_variable(meta_graph):
    _node(meta_graph.graph_def, "save/Identity_1").input[0] = "conv0/kernel/Read/ReadVariableOp"


def _has_resource_variables(saved_model_dir) -> bool:
    """True for TF2 behaviour's resource variables, False for TF1 behaviour's ref variables."""
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as handle:
        saved_model.ParseFromString(handle.read())
    return any(node.op == "VarHandleOp" for node in saved_model.meta_graphs[0].graph_def.node)


def _collection_node(meta_graph):
    meta_graph.collection_def["my_ops"].node_list.value.append("no_such_node")


SAVED_MODEL_CASES = [
    ("checkpoint_key", _restore_names, ["restores variable 'conv0/kernal'", "checkpoint does not hold"]),
    ("variable_dtype", _variable_dtype, {
        "resource": ["uses variable 'dense/bias' as float32, but the variable is int64"],
        "ref": ["'dense/bias'", "is int64 (ref), but Assign expects float (ref) there"]}),
    ("signature_tensor", _signature_tensor, ["signature 'serving_default' input 'images' names 'imagez:0'"]),
    ("saver_tensor", _saver_tensor, ["its Saver's filename tensor names 'sav%/Const:0'"]),
    ("collection_node", _collection_node, ["cannot import it", "no_such_node"]),
    ("restore_reads_variable", _restore_reads_variable, {
        "resource": ["cannot restore: its Saver's restore op reads variable 'conv0/kernel'",
                     "before restoring it"],
        "ref": None}),  # ref variables: test_a_restore_that_reads_a_ref_variable_is_refused
]


@pytest.mark.parametrize("case,change,words", SAVED_MODEL_CASES, ids=[case[0] for case in SAVED_MODEL_CASES])
def test_saved_models_that_would_not_load_are_refused(case, change, words, saved_model_dir, tmp_path, capsys):
    if isinstance(words, dict):  # the variables' kind decides what is wrong
        words = words["resource" if _has_resource_variables(saved_model_dir) else "ref"]
        if words is None:
            pytest.skip("a case of resource variables; this run's SavedModel has ref variables")
    source, output = _damaged_saved_model(saved_model_dir, tmp_path, change)
    _assert_refused(capsys, source, output, words)


def test_a_restore_that_reads_a_ref_variable_is_refused(tmp_path, capsys):
    path = str(tmp_path / "ref_model")
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 4], use_resource=False)
        y = tf.identity(tf.linalg.matmul(x, w), name="y")
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            builder = tf1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": tf1.saved_model.predict_signature_def({"x": x}, {"y": y})})
            builder.save()
    code, _, err = run_main(capsys, "convert", path, str(tmp_path / "fine"), "--target", "cpu")
    assert code == 0, err
    assign = "save/Assign"

    def read_instead_of_restore(meta_graph):
        _node(meta_graph.graph_def, assign).input[1] = "w"  # Assign(w, w): reads w uninitialised

    source, output = _damaged_saved_model(path, tmp_path / "damaged", read_instead_of_restore)
    _assert_refused(capsys, source, output, ["restore op reads variable 'w' (node 'save/Assign')"])


def test_a_damaged_variables_index_is_refused(saved_model_dir, tmp_path, capsys):
    source, output = _damaged_saved_model(saved_model_dir, tmp_path, lambda meta: None)
    index = os.path.join(source, "variables", "variables.index")
    data = bytearray(open(index, "rb").read())
    data[len(data) // 2] ^= 0x10
    with open(index, "wb") as handle:
        handle.write(bytes(data))
    _assert_refused(capsys, source, output, ["its variables/ checkpoint cannot be read"])


class _Scale(tf.Module):
    def __init__(self):
        super().__init__()
        self.kernel = tf.Variable(np.ones([4, 4], np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def __call__(self, x):
        return tf.linalg.matmul(x, self.kernel)


@pytest.mark.tf2_behavior("tf.saved_model.save of a tf.Module with a tf.function")
def test_a_tf2_saved_model_whose_checkpoint_lacks_a_variable_is_refused(tmp_path, capsys):
    """TF2's restore runs in a library function: its RestoreV2 is checked there."""
    module = _Scale()
    tf.saved_model.save(module, str(tmp_path / "tf2"), signatures=module.__call__)
    source, output = str(tmp_path / "tf2"), str(tmp_path / "out" / "converted")
    (tmp_path / "out").mkdir()
    code, _, err = run_main(capsys, "convert", source, output, "--target", "cpu")
    assert code == 0, err
    shutil.rmtree(output)
    checkpoint = tf.train.Checkpoint(other=tf.Variable(1.0))  # a checkpoint of something else
    checkpoint.write(os.path.join(source, "variables", "variables"))
    _assert_refused(capsys, source, output, ["restores variable 'kernel/.ATTRIBUTES/VARIABLE_VALUE'",
                                             "checkpoint does not hold"])


def test_a_metagraph_is_checked_like_a_saved_model(tmp_path, capsys):
    meta_dir = tmp_path / "meta"
    meta_dir.mkdir()
    path = models.meta_graph(str(meta_dir))
    meta_graph = tf1.MetaGraphDef()
    with open(path, "rb") as handle:
        meta_graph.ParseFromString(handle.read())
    _node(meta_graph.graph_def, "conv0/Conv2D").attr["padding"].s = b"SAME_"
    with open(path, "wb") as handle:
        handle.write(meta_graph.SerializeToString())
    (tmp_path / "out").mkdir()
    _assert_refused(capsys, path, str(tmp_path / "out" / "out.meta"), ["attr 'padding' is 'SAME_'"])


# -- the backstop --------------------------------------------------------------------------
def test_an_unexpected_exception_is_still_one_line(tmp_path, capsys, monkeypatch):
    def broken(saved, options, *_, **__):
        raise TypeError("Cannot convert the argument `type_value`: 0 to a TensorFlow DType.")

    monkeypatch.setattr(conversion, "convert", broken)
    source = models.write_frozen(EXPLAIN, str(tmp_path / "in.pb"))
    (tmp_path / "out").mkdir()
    code, _, err = run_main(capsys, "convert", source, str(tmp_path / "out" / "out.pb"))
    assert code == 2 and os.listdir(tmp_path / "out") == []
    assert err.strip().splitlines() == [
        "tfamp-rewrite: internal error (TypeError: Cannot convert the argument `type_value`: 0 to a "
        "TensorFlow DType.); nothing was written. Please report it with the input and this command line"]


def test_a_valid_graph_still_converts_and_runs(tmp_path, capsys):
    """The checks refuse nothing valid: the converted graph imports and runs in half."""
    source = models.write_frozen(EXPLAIN, str(tmp_path / "in.pbtxt"), text=True)
    output = str(tmp_path / "out.pbtxt")
    code, _, err = run_main(capsys, "convert", source, output, "--target", "cpu")
    assert code == 0, err
    converted = graph_pb2.GraphDef()
    text_format.Parse(open(output).read(), converted)
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(converted, name="")
        with tf1.Session(graph=graph) as session:
            probs = session.run("probs:0", {"x:0": np.ones([2, 16], np.float32)})
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-2)


def test_a_malformed_input_of_an_unregistered_op_is_refused(tmp_path, capsys):
    def change(node):
        node.op = "MyCustomExp"
        node.input[0] = "relu:first"

    source = models.write_frozen(_edit(EXPLAIN, "exp", change), str(tmp_path / "in.pb"))
    (tmp_path / "out").mkdir()
    _assert_refused(capsys, source, str(tmp_path / "out" / "out.pb"),
                    ["node 'exp'", "malformed input 'relu:first'"])


def test_checking_leaves_the_graph_in_memory_as_read(tmp_path):
    """TensorFlow's importer fills default attributes into the GraphDef it is given: the check
    must not, or a graph without them (as TF 1.15 writes) would be converted with them."""
    from tfamp_rewrite.graph_rewrite.forward_compat import strip_default_attrs
    from tfamp_rewrite.graph_rewrite.rewrite import op_def_lookup
    from tfamp_rewrite.saved_graph.formats import read_saved_graph
    from tfamp_rewrite.saved_graph.import_check import check_importable

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 4, 4, 2], name="x")
        tf.nn.max_pool2d(x, 2, 2, "SAME", name="pool")
    graph_def = graph.as_graph_def()
    assert strip_default_attrs(graph_def, op_def_lookup(graph_def)) > 0
    saved = read_saved_graph(models.write_frozen(graph_def, str(tmp_path / "g.pb")), None)
    before = saved.graph_def.SerializeToString(deterministic=True)
    check_importable(saved)
    assert saved.graph_def.SerializeToString(deterministic=True) == before
