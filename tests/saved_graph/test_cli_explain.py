"""``tfamp-rewrite explain``: the pass summary, and reason chains that follow ``related``."""
from __future__ import annotations

import pytest
import saved_graph_models as models
from cli_helpers import run_main

from tfamp_rewrite.errors import ConversionError
from tfamp_rewrite.graph_rewrite.report import NodeDecision, RewriteReport
from tfamp_rewrite.saved_graph.explain import format_chain, reason_chain


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    return models.write_frozen(models.explain_graph(), str(tmp_path_factory.mktemp("explain") / "g.pb"))


def _chain_lines(out: str, node: str):
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(node + ": "))
    return lines[start:]


@pytest.mark.parametrize("node, dtype, chain, root", [
    ("softmax", "float32", ["softmax  Softmax  infer list  float32: on a deny path from 'exp' (Exp, deny)",
                            "<- exp  Exp  deny list  float32: deny list: kept float32 for numerical safety"],
     "'exp', Exp, deny list"),
    ("relu", "float16", ["relu  Relu  clear list  float16: clear op connected to float16 op 'bias' "
                         "through clear ops",
                         "<- bias  BiasAdd  infer list  float16: infer op directly after allow op 'mm'",
                         "<- mm  MatMul  allow list  float16: allow list: always float16"],
     "'mm', MatMul, allow list"),
    ("w", "float16", ["w  Const  unlisted  float16: constant folded to float16: it feeds only "
                      "float16 ops ('mm')",
                      "<- mm  MatMul  allow list  float16: allow list: always float16"],
     "'mm', MatMul, allow list"),
])
def test_explain_node_prints_the_reason_chain(graph_file, capsys, node, dtype, chain, root):
    code, out, err = run_main(capsys, "explain", graph_file, "--node", node)
    assert code == 0, err
    lines = _chain_lines(out, node)
    assert lines[0] == "%s: %s (root cause: %s)" % (node, dtype, root)
    assert [line.strip() for line in lines[1:]] == chain


def test_explain_prints_nvidia_fields_op_counts_and_tensor_cores(graph_file, capsys):
    code, out, _ = run_main(capsys, "explain", graph_file)
    assert code == 0
    for field in ("Total processable nodes:", "Recognized nodes available for conversion:",
                  "Total nodes converted:", "Total FP16 Cast ops used:", "Allow-list nodes converted:",
                  "Deny-list nodes blocking conversion:",
                  "Nodes blocked from conversion by deny-list nodes:"):
        assert field in out
    assert "  MatMul                                 1         1" in out
    assert "Tensor Cores: 100.0% of MatMul/Conv FLOPs run in float16" in out
    assert "pad N 12 -> 16" in out  # mm: [?, 16] x [16, 12]


def test_explain_all_nodes_gives_one_line_per_node(graph_file, capsys):
    code, out, _ = run_main(capsys, "explain", graph_file, "--all-nodes")
    assert code == 0
    table = [line for line in out.splitlines() if line.startswith(("exp ", "add ", "probs "))]
    assert len(table) == 3
    assert table[0].split()[:3] == ["exp", "Exp", "float32"]


def test_explain_unknown_node_suggests_close_names(graph_file, capsys):
    code, _, err = run_main(capsys, "explain", graph_file, "--node", "softmx")
    assert code == 2
    assert err.strip() == ("tfamp-rewrite: the graph has no node 'softmx'. Nodes with similar names: softmax")


def test_explain_honours_the_rewrite_options(graph_file, capsys):
    code, out, _ = run_main(capsys, "explain", graph_file, "--node", "mm", "--op-types-to-exclude", "MatMul")
    assert code == 0
    assert _chain_lines(out, "mm")[0] == "mm: float32"
    assert "excluded: op type MatMul" in out


def test_reason_chain_stops_at_a_cycle():
    report = RewriteReport(dtype="float16", target="gpu", compat="latest")
    report.decisions = [NodeDecision("a", "Merge", "float32", "loop", related="b"),
                        NodeDecision("b", "NextIteration", "float32", "loop", related="a")]
    assert [d.name for d in reason_chain(report, "a")] == ["a", "b"]
    headline = format_chain(reason_chain(report, "b")).splitlines()[0]
    assert headline == "b: float32 (root cause: 'a', Merge, unlisted)"
    with pytest.raises(ConversionError):
        reason_chain(report, "c")
