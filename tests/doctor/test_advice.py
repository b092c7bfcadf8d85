"""The loss-scale advice and the fixes, from ranges whose answers are known."""
from __future__ import annotations

import math

import pytest

from tfamp_rewrite.doctor.advice import advise, check_scale
from tfamp_rewrite.doctor.fixes import find_risks, fix_for, keep_float32
from tfamp_rewrite.doctor.limits import limits_for
from tfamp_rewrite.doctor.probes import ACTIVATION_GRADIENT, FORWARD, HalfNode
from tfamp_rewrite.doctor.ranges import StepRecord, TensorRange

FP16 = limits_for("float16")


def gradient(exponents, role=ACTIVATION_GRADIENT, name="g"):
    counts = {}
    for e in exponents:
        counts[e] = counts.get(e, 0) + 1
    return TensorRange(tensor=name + ":0", node=name, op="MatMul", category="allow", role=role,
                       half_nodes=[HalfNode(name, "MatMul", "allow")], runs=1, elements=len(exponents),
                       max_abs=2.0 ** (max(exponents) + 1) * 0.99, min_abs_nonzero=2.0 ** min(exponents),
                       histogram=sorted([e, n] for e, n in counts.items()))


def test_recommended_scale_is_the_largest_power_of_two_with_the_margin():
    ranges = [gradient([-30] * 6 + [-20] * 3 + [-11])]        # largest |g| just under 2**-10
    steps = [StepRecord(1.0, 2.0 ** -10), StepRecord(1.0, 2.0 ** -10.5)]
    advice = advise(ranges, steps, FP16, margin_log2=3)
    expected = math.floor(math.log2(65504) - math.log2(ranges[0].max_abs) - 3)
    assert advice.recommended == 2.0 ** expected == 2.0 ** 23  # 0.99 * 2**13 * 8 < 65504
    assert advice.unscaled.flush == pytest.approx(0.6) and advice.at_recommended.flush == 0.0
    assert advice.at_recommended.overflow == 0.0
    assert check_scale(ranges, FP16, expected + 4).overflow > 0  # beyond the margin it overflows
    assert advice.scaling_needed and not advice.dynamic_needed


def test_dynamic_scaling_when_the_largest_gradient_moves_more_than_the_margin():
    ranges = [gradient([-30, -28, -10])]
    steps = [StepRecord(1.0, 2.0 ** -10), StepRecord(1.0, 2.0 ** -16)]
    advice = advise(ranges, steps, FP16, margin_log2=3)
    assert advice.dynamic_needed and "dynamic loss scaling" in advice.verdict


def test_no_scaling_when_gradients_fit():
    advice = advise([gradient([-5, -3, 0])], [StepRecord(1.0, 1.0)], FP16)
    assert not advice.scaling_needed and "no loss scaling needed" in advice.verdict
    assert advise([gradient([-3], role=FORWARD)], [], FP16) is None


def test_fixes_name_no_node_the_session_added_to_the_users_graph():
    """A histogram summary's finite-values filter (``.../tfamp_finite_values/flat``) was kept
    with the layer it reads, and named in nodes_to_exclude and the list edit, though the
    user's graph holds no such node."""
    layer = HalfNode("dense/MatMul", "MatMul", "allow")
    ours = HalfNode("dense/Relu/tfamp_finite_values/flat", "Reshape", "clear")
    fix = fix_for([layer, ours])
    assert fix.nodes_to_exclude == ["^dense/MatMul$"] and "Reshape" not in fix.env
    assert fix.nodes == ["dense/MatMul", "dense/Relu/tfamp_finite_values/flat"]  # both kept


@pytest.mark.parametrize("scope", ["unscale_and_check_finite", "unscale_and_check_finite_1"])
def test_fixes_name_none_of_the_loss_scalings_own_nodes(scope):
    """On a server session the unscale group runs as stock ops, and its half IsFinite next to
    the culprit was named in nodes_to_exclude and deny-listed, an op the user never made."""
    culprit = HalfNode("gradients/out/MatMul_grad/MatMul_1", "MatMul", "allow")
    ours = HalfNode(scope + "/group/is_finite_2", "IsFinite", "clear")
    fix = fix_for([culprit, ours])
    assert fix.nodes_to_exclude == ["^gradients/out/MatMul_grad/MatMul_1$"] and "IsFinite" not in fix.env


def test_fixes_name_no_shape_of_a_half_tensor():
    """A -1e9 fill read by a loss's shape checks: its Shape readers were named and offered as
    DENYLIST_ADD=...,Shape, which would keep every shape of the model float32 for nothing."""
    fill = HalfNode("mask/Fill", "Fill", "clear")
    shape = HalfNode("SparseSoftmaxCrossEntropyWithLogits/Shape_2", "Shape", "clear")
    fix = fix_for([fill, shape])
    assert fix.nodes_to_exclude == ["^mask/Fill$"] and "Shape" not in fix.env
    assert fix.nodes == ["mask/Fill", "SparseSoftmaxCrossEntropyWithLogits/Shape_2"]


def test_fixes_name_every_node_holding_the_tensor_and_the_list_edit():
    producer, reader = HalfNode("sq", "Mul", "infer"), HalfNode("mm2", "MatMul", "allow")
    fix = fix_for([producer, reader])
    assert fix.lists == {"allow_remove": ["MatMul"], "infer_remove": ["Mul"], "deny_add": ["Mul", "MatMul"]}
    assert fix.env.split() == ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE=MatMul",
                               "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_REMOVE=Mul",
                               "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD=Mul,MatMul"]
    overflowing = gradient([17, 3], role=FORWARD, name="sq")
    overflowing.half_nodes, overflowing.overflow = [producer, reader], 1
    flushing = gradient([-30, -30, -2], role=FORWARD, name="tiny")
    fine = gradient([-2, 3], role=FORWARD, name="fine")
    risks = find_risks([fine, flushing, overflowing], FP16, lambda r: 0)
    assert [(r.kind, r.node) for r in risks] == [("overflow", "sq"), ("underflow", "tiny")]
    kept = keep_float32(risks, "float16")
    assert set(kept) == {"sq", "mm2", "tiny"} and "it reads 'sq:0'" in kept["mm2"]


def test_op_type_edits_leave_out_ops_that_only_pass_values_on():
    """A backward while loop healed whole: its Conv2DBackpropFilter beside Identity, Enter and
    Reshape nodes.  DENYLIST_ADD=...,Identity,Enter,Reshape would keep every such node of
    the model float32; the node-level exclusion names them all."""
    nodes = [HalfNode("gradients/while/Conv2D_grad/Conv2DBackpropFilter", "Conv2DBackpropFilter", "allow"),
             HalfNode("gradients/while/Identity_3", "Identity", "clear"),
             HalfNode("gradients/while/Enter_2", "Enter", "clear"),
             HalfNode("gradients/while/Reshape", "Reshape", "clear")]
    fix = fix_for(nodes)
    assert fix.lists == {"allow_remove": ["Conv2DBackpropFilter"], "deny_add": ["Conv2DBackpropFilter"]}
    assert len(fix.nodes_to_exclude) == 4
    movers = fix_for(nodes[1:])  # nothing computes: the movers' types are the only edit there is
    assert movers.lists["deny_add"] == ["Identity", "Enter", "Reshape"]
