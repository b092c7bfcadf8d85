"""Property tests of ``tfamp-rewrite convert``'s options on generated graphs.

A generated frozen graph (a random DAG of MatMul, BiasAdd, Relu, Tanh, Exp, Softmax, Add
and scaling by constants, one of which may not fit float16) is converted with a random
combination of ``--keep-io-types`` / ``--no-keep-io-types``, ``--op-types-to-exclude``,
``--op-types-to-include``, ``--nodes-to-exclude`` (sometimes not a regular expression),
``--dtype``, ``--target``, ``--compat`` and ``--out-of-range``, as ``.pb`` or ``.pbtxt``.
The command line's contract must hold: exit 0 with an output TensorFlow imports (and, for
``--target cpu``, runs), or exit 2 with one line and nothing written -- exit 2 exactly
when an option is invalid --; the input is never modified.  And what the options promise:
with keep-io-types inputs and outputs keep float32; excluded nodes are left as they are.
"""
from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import saved_graph_models as models
import tensorflow as tf
from cli_fuzz import digest, read_message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import graph_pb2

from tfamp_rewrite.saved_graph.cli import main
from tfamp_rewrite.tf_compat import lookup_op_def

tf1 = tf.compat.v1
FLOAT = tf.float32.as_datatype_enum
WIDTH = 8
STEPS = ("matmul", "bias_add", "relu", "tanh", "exp", "softmax", "add", "scale", "scale_big")
_examples = settings(max_examples=int(os.environ.get("TFAMP_PROPERTY_EXAMPLES", "30")), deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@st.composite
def frozen_graphs(draw):
    """``(graph_def, node names)``: x [None, 8] -> random steps; nodes named s<i>_<step>."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    graph = tf.Graph()
    with graph.as_default():
        tensors = [tf1.placeholder(tf.float32, [None, WIDTH], name="x")]
        for i in range(draw(st.integers(1, 8))):
            step = draw(st.sampled_from(STEPS))
            a = tensors[draw(st.integers(0, len(tensors) - 1))]
            name = "s%d_%s" % (i, step)
            if step == "matmul":
                weights = tf.constant(rng.standard_normal([WIDTH, WIDTH]).astype(np.float32) * 0.3)
                out = tf.linalg.matmul(a, weights, name=name)
            elif step == "bias_add":
                bias = tf.constant(rng.standard_normal([WIDTH]).astype(np.float32))
                out = tf.nn.bias_add(a, bias, name=name)
            elif step == "add":
                out = tf.add(a, tensors[draw(st.integers(0, len(tensors) - 1))], name=name)
            elif step in ("scale", "scale_big"):
                out = tf.multiply(a, tf.constant(1e5 if step == "scale_big" else 0.5), name=name)
            else:
                out = {"relu": tf.nn.relu, "tanh": tf.tanh, "exp": tf.exp, "softmax": tf.nn.softmax}[step](
                    a, name=name)
            tensors.append(out)
    graph_def = graph.as_graph_def()
    return graph_def, [node.name for node in graph_def.node]


@st.composite
def option_sets(draw, names):
    """``(argv options, the options an error may name: empty when all are valid)`` for a graph
    with node ``names``."""
    argv = []
    argv += draw(st.sampled_from([[], ["--keep-io-types"], ["--no-keep-io-types"]]))
    dtype = draw(st.sampled_from([[], ["--dtype", "float16"], ["--dtype", "bfloat16"]]))
    compat = draw(st.sampled_from([[], ["--compat", "tf1.15"], ["--compat", "tf2.15"]]))
    argv += dtype + compat + draw(st.sampled_from([[], ["--target", "gpu"], ["--target", "cpu"]]))
    argv += draw(st.sampled_from([[], ["--out-of-range", "clamp"]]))
    for op in draw(st.lists(st.sampled_from(["MatMul", "Relu", "Exp", "Softmax", "AddV2", "Mul", "NoSuchOp"]),
                            max_size=2, unique=True)):
        argv += [draw(st.sampled_from(["--op-types-to-exclude", "--op-types-to-include"])), op]
    invalid = ["compat"] if "bfloat16" in dtype and "tf1.15" in compat else []  # 1.15: float16 only
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["name", "prefix", "broken"]))
        name = draw(st.sampled_from(names))
        if kind == "broken":
            argv += ["--nodes-to-exclude", name + "["]
            invalid.append("--nodes-to-exclude")
        else:
            argv += ["--nodes-to-exclude", re.escape(name) if kind == "name" else re.escape(name[:2]) + ".*"]
    return argv, invalid


@_examples
@given(st.data())
def test_options_keep_the_command_line_contract(data):
    graph_def, names = data.draw(frozen_graphs())
    options, invalid = data.draw(option_sets(names))
    text = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as root:
        name = "in.pbtxt" if text else "in.pb"
        source = models.write_frozen(graph_def, os.path.join(root, name), text=text)
        out_dir = os.path.join(root, "out")
        os.mkdir(out_dir)
        output = os.path.join(out_dir, "out.pbtxt" if text else "out.pb")
        before = digest(source)
        code, err = _convert(source, output, options)
        assert digest(source) == before, "the input was modified"
        if invalid:
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and any(word in lines[0] for word in invalid), err
            assert os.listdir(out_dir) == []
            return
        assert code == 0, err
        converted = read_message(graph_pb2.GraphDef(), output, text)
    _assert_promises(graph_def, converted, options)
    _import_and_maybe_run(graph_def, converted, run="cpu" in options)


def _convert(source, output, options):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["convert", source, output, "-q"] + options)
    return code, err.getvalue()


def _assert_promises(graph_def, converted, options):
    before = {node.name: node for node in graph_def.node}
    after = {node.name: node for node in converted.node}
    if "--no-keep-io-types" not in options:
        assert after["x"].attr["dtype"].type == FLOAT
        consumed = {text.lstrip("^").split(":")[0] for node in graph_def.node for text in node.input}
        for name in set(before) - consumed:
            if before[name].op != "Const":
                assert _dtype(after[name]) == _dtype(before[name]), "output %s changed dtype" % name
    excluded_ops = {options[i + 1] for i, flag in enumerate(options) if flag == "--op-types-to-exclude"}
    patterns = [options[i + 1] for i, flag in enumerate(options) if flag == "--nodes-to-exclude"]
    for name, node in before.items():
        if node.op != "Const" and (node.op in excluded_ops or any(re.match(p, name) for p in patterns)):
            assert after[name].op == node.op and _set_attrs(after[name]) == _set_attrs(node), name


def _set_attrs(node):
    """The attributes that are not at their OpDef default: ``--compat tf1.15`` leaves
    default-valued ones out of every node, as TensorFlow's own strip_default_attrs does."""
    defaults = {a.name: a.default_value for a in lookup_op_def(node.op).attr if a.HasField("default_value")}
    return {key: value for key, value in node.attr.items() if defaults.get(key) != value}


def _dtype(node):
    for key in ("T", "dtype"):
        if key in node.attr:
            return node.attr[key].type
    return None


def _import_and_maybe_run(graph_def, converted, run):
    sinks = [n.name for n in graph_def.node
             if n.name not in {t.lstrip("^").split(":")[0] for m in graph_def.node for t in m.input}
             and n.op != "Const"]
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(converted, name="")
        if not run:
            return
        with tf1.Session(graph=graph) as session:
            feed = np.random.default_rng(0).standard_normal([3, WIDTH]).astype(np.float32)
            x = graph.get_tensor_by_name("x:0")
            values = session.run([name + ":0" for name in sinks], {x: feed.astype(x.dtype.as_numpy_dtype)})
    assert all(value.shape == (3, WIDTH) for value in values)


def test_an_excluded_input_keeps_float32_without_keep_io_types(tmp_path):
    """Found by the property above: releasing inputs to half ignored --nodes-to-exclude."""
    source = models.write_frozen(models.explain_graph(), str(tmp_path / "in.pb"))
    dtypes = {}
    for case, extra in (("released", []), ("excluded", ["--nodes-to-exclude", "x$"]),
                        ("op_excluded", ["--op-types-to-exclude", "Placeholder"])):
        output = str(tmp_path / (case + ".pb"))
        code, err = _convert(source, output, ["--no-keep-io-types", "--target", "cpu"] + extra)
        assert code == 0, err
        converted = read_message(graph_pb2.GraphDef(), output, False)
        dtypes[case] = next(node for node in converted.node if node.name == "x").attr["dtype"].type
    assert dtypes == {"released": tf.float16.as_datatype_enum, "excluded": FLOAT, "op_excluded": FLOAT}
