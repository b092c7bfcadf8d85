"""The report: JSON-ready data, NVIDIA's summary fields, and a reason for every node."""
import json

import numpy as np
import tensorflow as tf
from model_graphs import conv_net

from tfamp_rewrite import rewrite_graph_def

tf1 = tf.compat.v1


def explained_graph():
    """mm (allow) -> relu -> add -> mm2; mm -> abs (clear) -> out3; exp (deny) -> add2 -> softmax."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.eye(4, dtype=np.float32), name="w")
        mm = tf.matmul(x, w, name="mm")
        relu = tf.nn.relu(mm, name="relu")
        tf.identity(tf.abs(mm, name="abs"), name="out3")
        mm2 = tf.matmul(tf.add(relu, w, name="add"), w, name="mm2")
        add2 = tf.add(tf.exp(x, name="exp"), mm2, name="add2")
        tf.identity(tf.nn.softmax(add2, name="softmax"), name="out")
        tf.identity(tf.tanh(x, name="lonely_tanh"), name="out2")
    return graph.as_graph_def()


def test_every_node_has_a_decision_and_reasons_name_their_source():
    result = rewrite_graph_def(explained_graph(), fetches=["out", "out2", "out3"], feeds=["x"],
                               target="cpu")
    report = result.report
    assert [d.name for d in report.decisions] == [n.name for n in explained_graph().node]
    expected = {
        "mm": ("float16", "allow_list", None),
        "relu": ("float16", "between_allow", "mm"),
        "abs": ("float16", "clear_flood", "mm"),
        "add": ("float16", "between_allow", "mm"),
        "exp": ("float32", "deny_list", None),
        "add2": ("float32", "deny_path", "exp"),
        "softmax": ("float32", "deny_path", "exp"),
        "lonely_tanh": ("float32", "infer_not_between", None),
        "out": ("float32", "not_eligible", None),
        "x": ("float32", "not_eligible", None),
        "w": ("float32", "unlisted", None),
    }
    for name, (dtype, rule, related) in expected.items():
        decision = report.decision(name)
        assert (decision.dtype, decision.rule, decision.related) == (dtype, rule, related), decision
    assert report.decision("softmax").reason == "on a deny path from 'exp' (Exp, deny)"
    assert report.decision("add").reason == \
        "infer op between allow ops: downstream of 'mm', upstream of 'mm2'"


def test_counters_agree_with_the_graph_and_decisions():
    model = conv_net()
    result = rewrite_graph_def(model.graph_def, fetches=model.fetches, feeds=model.feeds, target="cpu")
    report = result.report
    added = [n for n in result.graph_def.node if n.op == "Cast" and n.name.endswith("AutoMixedPrecision")]
    assert report.casts_added == len(added) == len(report.casts)
    assert report.casts_to_half + report.casts_to_float == report.casts_added
    assert report.nodes_converted == sum(d.converted for d in report.decisions)
    assert report.nodes_total == len(model.graph_def.node)
    allow_converted = sum(d.converted and d.category == "allow" for d in report.decisions)
    assert report.allow_nodes_converted == allow_converted
    assert sum(c["total"] for c in report.op_counts.values()) == report.nodes_total
    assert report.op_counts["Conv2D"] == {"total": 2, "converted": 2}
    assert 0 < report.nodes_recognized <= report.nodes_processable <= report.nodes_total


def test_report_is_json_data():
    report = rewrite_graph_def(explained_graph(), fetches=["out"], target="cpu").report
    data = json.loads(json.dumps(report.to_dict()))
    for key in ("nodes_total", "nodes_processable", "nodes_converted", "casts_added", "decisions"):
        assert key in data
    assert set(data["decisions"][0]) >= {"name", "op", "dtype", "reason"}


def test_summary_has_nvidia_fields_and_tensorflows_log_line():
    report = rewrite_graph_def(explained_graph(), fetches=["out"], target="cpu").report
    text = report.summary()
    for field in ("Total processable nodes", "Recognized nodes available for conversion",
                  "Total nodes converted", "Total FP16 Cast ops used",
                  "Deny-list nodes blocking conversion", "Nodes blocked from conversion by deny-list nodes"):
        assert field in text
    assert "Converted %d/%d nodes to float16 precision" % (report.nodes_converted, report.nodes_total) in text
    assert "MatMul" in text  # per-op-type counts


def test_an_infer_chain_after_an_allow_op_names_each_link_as_what_it_is():
    """The newest pass paints an infer op after an allow op allow, then the infer op after
    that one: the second's reason does not call the first Add an allow op."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        first = tf.add(tf.matmul(x, tf.ones([8, 8]), name="mm"), 1.0, name="first")
        tf.reduce_sum(tf.add(first, 2.0, name="second"), name="out")
    report = rewrite_graph_def(graph.as_graph_def(), fetches=["out"], target="cpu", compat="latest").report
    assert report.decision("first").reason == "infer op directly after allow op 'mm'"
    assert report.decision("second").reason == ("infer op directly after 'first', an infer op painted "
                                                "allow the same way")
