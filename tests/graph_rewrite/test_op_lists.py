"""The op lists: TensorFlow's data, the environment-variable edits, overrides and conflicts."""
import pytest
import tensorflow as tf
from grappler_oracle import oracle_compat, oracle_lists, run_grappler_amp
from test_numerics import overflow_probe_graph

from tfamp_rewrite import OpLists, builtin_lists, rewrite_graph_def
from tfamp_rewrite.graph_rewrite.op_lists import effective_lists

PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"


@pytest.mark.parametrize("compat,dtype,sizes", [
    ("tf1.15", "float16", (18, 35, 13, 101)),   # reference: 16 white + BatchMatMul(V2), 35, 13, 101
    ("latest", "float16", (39, 43, 9, 110)),
    ("latest", "bfloat16", (14, 48, 7, 111)),
])
def test_builtin_list_sizes_match_tensorflow_sources(compat, dtype, sizes):
    lists = builtin_lists(dtype, compat).validate()
    assert (len(lists.allow), len(lists.infer), len(lists.deny), len(lists.clear)) == sizes


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_builtin_lists_equal_the_installed_tensorflows(dtype):
    """Our data for the installed TensorFlow's version equals what its pass dumps."""
    compat = "tf2.15" if tf.__version__.startswith("2.15.") else "latest"
    theirs = oracle_lists(dtype)
    if dtype == "bfloat16" and compat == "tf2.15":  # a missing comma in TF 2.15's source
        theirs = OpLists(theirs.allow, theirs.infer - {"SumTanh"}, theirs.deny, theirs.clear)
    assert builtin_lists(dtype, compat) == theirs


def test_tf115_lists_keep_softmax_and_log_deny():
    old, new = builtin_lists("float16", "tf1.15"), builtin_lists("float16", "latest")
    for op in ("Log", "Log1p", "LogSoftmax", "Softmax"):
        assert op in old.deny and op in new.infer


@pytest.mark.parametrize("add_var,remove_var", [
    ("DENYLIST_ADD", "ALLOWLIST_REMOVE"), ("BLACKLIST_ADD", "WHITELIST_REMOVE"),
])
def test_environment_edits_with_new_and_legacy_names(monkeypatch, add_var, remove_var):
    monkeypatch.setenv(PREFIX + add_var, "Tanh, Relu")
    monkeypatch.setenv(PREFIX + "INFERLIST_REMOVE", "Tanh")
    monkeypatch.setenv(PREFIX + "CLEARLIST_REMOVE", "Relu")
    monkeypatch.setenv(PREFIX + remove_var, "MatMul")
    lists = effective_lists()
    assert {"Tanh", "Relu"} <= lists.deny and "MatMul" not in lists.allow


def test_environment_edit_changes_the_rewrite(monkeypatch):
    """Removing MatMul from the allow list keeps the overflow probe finite."""
    monkeypatch.setenv(PREFIX + "ALLOWLIST_REMOVE", "MatMul")
    result = rewrite_graph_def(overflow_probe_graph(), fetches=["out"], target="cpu")
    assert result.report.nodes_converted == 0


def test_conflicting_lists_are_a_clear_error_unlike_tensorflow(monkeypatch):
    monkeypatch.setenv(PREFIX + "DENYLIST_ADD", "Relu")  # Relu is also clear
    with pytest.raises(ValueError, match=r"'Relu' is in both the deny and the clear list"):
        rewrite_graph_def(overflow_probe_graph(), fetches=["out"])
    # With the same environment, TensorFlow's pass fails silently: graph returned unchanged.
    assert not run_grappler_amp(overflow_probe_graph(), ["out"]).succeeded


def test_a_misspelled_variable_or_op_type_is_warned_about_where_tensorflow_is_silent(monkeypatch):
    monkeypatch.setenv(PREFIX + "DENYLST_ADD", "Exp")  # not read: the rewrite is unchanged
    monkeypatch.setenv(PREFIX + "DENYLIST_ADD", "Softmaxx, tanh, Sin")
    monkeypatch.setenv(PREFIX + "INFERLIST_REMOVE", "Tanh")  # the fix for "tanh"
    result = rewrite_graph_def(overflow_probe_graph(), fetches=["out"], target="cpu")
    misspelled_variable, softmaxx, tanh = result.report.warnings
    assert misspelled_variable == (PREFIX + "DENYLST_ADD is not a variable the mixed-precision pass "
                                   "reads (did you mean %sDENYLIST_ADD?); it is ignored" % PREFIX)
    assert softmaxx.startswith(PREFIX + "DENYLIST_ADD names Softmaxx, which is neither an op type")
    assert "(did you mean Softmax or LogSoftmax?)" in softmaxx and "(did you mean Tanh?)" in tanh
    assert "warning: " + tanh in result.report.summary()


def test_registered_op_types_the_graphs_own_and_known_variables_are_not_warned_about(monkeypatch):
    graph_def = overflow_probe_graph()
    custom = graph_def.node.add(name="custom", op="MyUnloadedCustomOp")  # its library not loaded here
    custom.input.append("out")
    monkeypatch.setenv(PREFIX + "DENYLIST_ADD", "Sin, MyUnloadedCustomOp")
    monkeypatch.setenv(PREFIX + "LOG_PATH", "/tmp")
    assert rewrite_graph_def(graph_def, fetches=["out"], target="cpu").report.warnings == []
    monkeypatch.setenv(PREFIX + "CLEARLIST_ADD", "Relux")  # an OpLists ignores the environment
    assert rewrite_graph_def(graph_def, fetches=["out"], target="cpu",
                             lists=builtin_lists()).report.warnings == []


def test_python_overrides_edit_or_replace():
    edited = effective_lists(lists={"deny_add": ["Tanh"], "infer_remove": ["Tanh"]})
    assert "Tanh" in edited.deny
    replaced = effective_lists(lists={"clear": ["Identity"]})
    assert replaced.clear == frozenset({"Identity"})
    exact = OpLists(frozenset({"MatMul"}), frozenset(), frozenset(), frozenset())
    assert effective_lists(lists=exact) is exact


@pytest.mark.parametrize("lists,words", [
    ({"allow_append": ["X"]}, "expected '<list>'"),
    ({"purple": ["X"]}, "unknown op list"),
    ({"deny": "Exp"}, "list of op names"),
    ("deny", "takes an OpLists"),
])
def test_bad_overrides_say_what_is_allowed(lists, words):
    with pytest.raises(ValueError, match=words):
        effective_lists(lists=lists)


def test_levels(monkeypatch):
    monkeypatch.setenv(PREFIX + "LEVEL", "TREAT_INFER_AS_DENY")
    assert "Tanh" in effective_lists().deny
    monkeypatch.setenv(PREFIX + "LEVEL", "TENSOR_CORES_ONLY")
    lists = effective_lists()
    assert lists.allow and not (lists.infer or lists.deny or lists.clear)
    monkeypatch.setenv(PREFIX + "LEVEL", "FAST")
    with pytest.raises(ValueError, match="UNSAFE_FORCE_ALL"):
        effective_lists()


def test_unsafe_force_all_converts_unlisted_ops(monkeypatch):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 2], name="x")
        tf.identity(tf.sin(tf.matmul(x, x), name="sin"), name="out")
    monkeypatch.setenv(PREFIX + "LEVEL", "UNSAFE_FORCE_ALL")
    result = rewrite_graph_def(graph.as_graph_def(), fetches=["out"], target="cpu")
    assert result.report.decision("sin").converted
    with pytest.raises(ValueError, match="bfloat16"):
        rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16")


def test_bfloat16_has_no_tf115_lists():
    with pytest.raises(ValueError, match="TensorFlow 1.15 only converts to float16"):
        builtin_lists("bfloat16", "tf1.15")


def test_oracle_compat_is_a_known_value():
    assert oracle_compat() in ("latest", "tf2.15")
