"""Grappler's ``auto_mixed_precision_test.cc``, case by case.

TF 1.15's 14 tests run under ``compat="tf1.15"`` (ids ``compat_tf115_*``); the newest
file's tests under the default compat.  Each case is checked three ways:

* ``test_expectations``: the C++ test's own assertions (nodes added, the dtype of every
  named type attribute, op changes, untouched graphs) on our rewrite;
* ``test_outputs_close``: the rewritten graph runs and its fetches match the original's
  within the C++ test's tolerance, emulated as the GPU the test was written for computes
  them (this CPU's own fp16/bf16 kernels run too);
* ``test_matches_tensorflow``: TensorFlow's own CPU pass, with its lists and rules, gives
  the same dtype on every float attribute and every Cast we add; where TensorFlow 2.15.1
  itself disagrees with the C++ expectation, the case names the nodes and the reason.

Known divergences, named where they apply:
  (a) TF 1.15 lists Log, Log1p, LogSoftmax and Softmax as deny; newer lists as infer.
  (b) Infer-after-allow (TF >= 2.19 in every mode; the newest test file's CUDA
      expectations predate it) makes an infer op fed directly by an allow op half.
  (c) TF >= 2.x no longer treats Stack / TensorArray as data structures (nor lists their
      ops as clear): they stay float32 with Casts around them.
  (d) TensorFlow's CPU mode processes nodes placed on the CPU.

AutoMixedPrecisionCpuTest checks TensorFlow's fp16 *emulation* on CPUs (allow ops stay
float32 between Casts); its two graphs are checked here with real conversion (``cpu_*``)
and, in test_emulation.py, our ``numerics="emulate"`` against TensorFlow's emulation.
TensorFlow 2.15.1's CPU pass applies (b) only for bfloat16; ``oracle_compat()`` gives our
side the same rules.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import grappler_case_graphs as graphs
import pytest
import tensorflow as tf
from grappler_cases import (
    F32_EPS,
    Divergence,
    GrapplerCase,
    assert_expectations,
    assert_matches_tensorflow,
    assert_outputs_close,
    graph_of,
    rewrite,
)

CPU_MODE = Divergence(
    "infer1 allow2 clr2",
    "(d) CPU mode converts allow2, which the test pins to the CPU; Tanh infer1 is then "
    "between two allow ops and Relu clr2 follows allow2")
INFER_AFTER_ALLOW = Divergence("infer1", "(b) Tanh infer1 reads MatMul allow1 directly")
SIMPLE_FLOAT32 = "input deny1 clr1 infer1 infer2 clr4 deny2.Ta deny2.Tb clr5"
TL_SET_GET_LOW = "tl1 tl1w1 allow1 tl1w2 tl1r1 infer1 allow2 tl1w3"

# The tests both files have (the newest file's names; TF 1.15 says wht/gry/blk).
SHARED = [
    GrapplerCase("no_op", graphs.no_op, added=0, unchanged=True,
                 float32="input deny1 clr1 infer1 clr2"),
    GrapplerCase("already_fp16", graphs.already_low_precision, added=0, unchanged=True,
                 low="cst1.DstT allow1 clr1 cst2.SrcT", float32="input cst2.DstT clr2"),
    GrapplerCase("simple", graphs.simple, added=2, tolerance=(F32_EPS, 5e-4),
                 low="clr2 allow1 clr3", float32=SIMPLE_FLOAT32),
    GrapplerCase("bidirectional_clear_chain", graphs.bidirectional_clear_chain, added=3,
                 low="clr1 clr2 allow1 clr3 clr4", float32="input"),
    GrapplerCase("preserve_fetches", graphs.preserve_fetches, added=2, tolerance=(F32_EPS, 5e-3),
                 low="allow2", float32="input allow1 clr1 infer1 deny1 clr2 clr3 deny2 clr4"),
    GrapplerCase("preserve_cpu_nodes", graphs.preserve_cpu_nodes, added=2,
                 low="clr1 allow1", float32="input infer1 allow2 clr2", tf=CPU_MODE),
    GrapplerCase("preserve_identity_after_variable", graphs.preserve_identity_after_variable,
                 added=5, tolerance=(F32_EPS, 5e-3),
                 low="allow1 clr2 allow2", float32="input var1 clr1 input2"),
    GrapplerCase("fused_batch_norm", graphs.fused_batch_norm, added=3, tolerance=(F32_EPS, 1e-3),
                 low="allow1 fbn1 bng1 infer1 allow2", float32="fbn1.U bng1.U",
                 ops={"fbn1": "FusedBatchNormV2", "bng1": "FusedBatchNormGradV2"}),
    GrapplerCase("repeated_and_list_type_attrs", graphs.repeated_and_list_type_attrs, added=2,
                 low="allow1 clr1.T[0] clr1.T[1] clr1.T[2] infer1 allow2", float32="input"),
    GrapplerCase("existing_cast", graphs.existing_cast, added=1,
                 low="cst1.DstT allow1", other={"cst1.SrcT": "bool"}),
    GrapplerCase("recurrent_edge_color_mismatch", graphs.recurrent_edge_color_mismatch, added=2,
                 low="allow1", float32="deny1 ent1 mrg1 swt1 infer1 nxt1 ext1 mrg2"),
    GrapplerCase("batch_mat_mul", graphs.batch_mat_mul, added=2, tolerance=(F32_EPS, 3e-3),
                 low="allow1", float32="input"),
]

STRUCTURES_DROPPED = "(c) TF 2.x leaves %s float32, so Tanh infer1 is not between allow ops"
TF115_ONLY = [
    GrapplerCase("tensor_array", graphs.tensor_array, added=2, tolerance=(F32_EPS, 5e-4),
                 low="ta1 ta1w1 allow1 ta1w2 ta1r1 infer1 allow2 ta1w3", float32="ta2 ta2w1 ta2r1",
                 tf=Divergence("ta1 ta1w1 ta1w2 ta1r1 infer1 ta1w3", STRUCTURES_DROPPED % "TensorArrays")),
    GrapplerCase("stack_v2", graphs.stack_v2, added=1, oracle_fetches=("handle1",),
                 low="stack1 psh1 allow1 psh2 pop1 infer1 allow2 psh3", float32="stack2 psh1-2 pop1-2",
                 tf=Divergence("stack1 psh1 psh2 pop1 infer1 psh3", STRUCTURES_DROPPED % "Stacks")),
]


def _unary(op: str) -> GrapplerCase:
    """TestSimpleUnaryInferOp(OP): MatMul -> OP -> MatMul, all three half."""
    atol, rtol = graphs.UNARY_INFER_OPS[op][2:]
    return GrapplerCase("unary_infer_" + op.lower(), partial(graphs.unary_infer, op), added=None,
                        low="allow1 infer1 allow2", float32="input",
                        tolerance=(F32_EPS if atol is None else atol, F32_EPS if rtol is None else rtol))


UNARY = [_unary(op) for op in graphs.UNARY_INFER_OPS]
# (a): with TF 1.15's lists these four are deny, so they stay float32 between the MatMuls.
TF115_DENIED_UNARY = [
    replace(case, low="allow1 allow2", float32="input infer1",
            tf=Divergence("infer1", "(a) TF 2.x lists %s as infer" % op))
    for case, op in zip(UNARY, graphs.UNARY_INFER_OPS) if op in ("Log", "Log1p", "LogSoftmax", "Softmax")]

NEWEST_ONLY = [
    GrapplerCase("tensor_list_set_get", graphs.tensor_list_set_get, added=2,
                 tolerance=(F32_EPS, 5e-4), low=TL_SET_GET_LOW, float32="tl2 tl2w1 tl2r1"),
    GrapplerCase("tensor_list_push_pop", graphs.tensor_list_push_pop, added=2,
                 tolerance=(F32_EPS, 5e-4), low=TL_SET_GET_LOW, float32="tl2 tl2w1 tl2r1"),
    # TF's 2e-4 is below float16's resolution (2**-11 ~ 4.9e-4): TF 2.21's CPU kernels land
    # at 3.3e-4, so this case uses the float16 resolution like its neighbours.
    GrapplerCase("tensor_list_from_tensor", graphs.tensor_list_from_tensor, added=2,
                 tolerance=(F32_EPS, 5e-4), low="allow1 tl1 tl1r1 infer1 allow2 tl2 tl2w1"),
    GrapplerCase("tensor_list_push_back_batch_and_concat_lists",
                 graphs.tensor_list_push_back_batch_and_concat_lists, added=2,
                 tolerance=(F32_EPS, 5e-4), low="allow1 allow2 infer1 tl1 tl2 tl3 tl3r1"),
    # The C++ test states no count; the cluster through Func1 must keep its dtype.
    GrapplerCase("tensor_list_through_function", graphs.tensor_list_through_function,
                 added=None, tolerance=(F32_EPS, 5e-4),
                 low="allow1 allow2 infer1 tl2 tl2w1 tl2r1", float32="tl1 tl1w1 tl1r1"),
] + UNARY + [
    # AutoMixedPrecisionCpuTest: TensorFlow emulates fp16 on the CPU (allow1 stays float32
    # between Cast(h->f) and Cast(f->h), +9 / +10 Casts); here the same graphs with real
    # conversion: the Casts sit where the half region starts / ends.  test_emulation.py
    # holds our numerics="emulate" against TensorFlow's emulation on both.
    GrapplerCase("cpu_simple", partial(graphs.simple, graphs.CPU0), added=2, target="cpu",
                 tolerance=(F32_EPS, 5e-4), low="clr2 allow1 clr3", float32=SIMPLE_FLOAT32,
                 cast_edges={("infer1", "clr2"): "float32->float16", ("clr2", "allow1"): None,
                             ("allow1", "clr3"): None, ("clr3", "infer2"): "float16->float32"}),
    GrapplerCase("cpu_mixed_fanout", graphs.mixed_fanout, added=4, target="cpu",
                 low="allow1 allow2", float32="input1 input2 deny infer",
                 cast_edges={("input1", "allow1"): "float32->float16",
                             ("input2", "allow2"): "float32->float16", ("allow1", "allow2"): None,
                             ("allow1", "deny"): "float16->float32",      # deny: Cast on its fanin
                             ("deny", "infer"): None,                     # ... none on its fanout
                             ("allow2", "infer"): "float16->float32"}),
] + [
    # AutoMixedPrecisionMklTest: bfloat16 on CPU-placed graphs.
    replace(case, dtype="bfloat16", target="cpu", id="bf16_" + case.id) for case in [
        GrapplerCase("already_bf16", partial(graphs.already_low_precision, tf.bfloat16, graphs.CPU0),
                     added=0, unchanged=True, low="cst1.DstT allow1 clr1 cst2.SrcT",
                     float32="input cst2.DstT clr2"),
        GrapplerCase("simple", partial(graphs.simple, graphs.CPU0), added=2,
                     tolerance=(F32_EPS, 5e-4), low="clr2 allow1 clr3", float32=SIMPLE_FLOAT32),
        # The bf16 file's infer1 is Mul, not Tanh.
        GrapplerCase("tensor_list_set_get", partial(graphs.tensor_list_set_get, graphs.CPU0, "Mul"),
                     added=2, tolerance=(F32_EPS, 1e-2), low=TL_SET_GET_LOW, float32="tl2 tl2w1 tl2r1"),
        # BiasAdd follows Conv2D directly: infer-after-allow makes it bf16, then Relu.
        GrapplerCase("infer_follow_up_stream_allow", partial(graphs.infer_follow_up_stream, "allow"),
                     added=4, tolerance=(F32_EPS, 1e-2), low="allow infer clr",
                     float32="input1 weight input2"),
        GrapplerCase("infer_follow_up_stream_deny", partial(graphs.infer_follow_up_stream, "deny"),
                     added=0, tolerance=(F32_EPS, F32_EPS),
                     float32="input1 input2 input3 deny infer clr"),
    ]
]

TF115 = [replace(case, id="compat_tf115_" + case.id, compat="tf1.15")
         for case in SHARED + TF115_ONLY + TF115_DENIED_UNARY]
# (b) changes one newest-file case: Tanh runs in fp16, so its outputs get an fp16
# tolerance instead of the 1e-6 the C++ test allows a float32 Tanh.
NEWEST_SHARED = [replace(case, ours=INFER_AFTER_ALLOW, tolerance=(F32_EPS, 5e-4))
                 if case.id == "preserve_cpu_nodes" else case for case in SHARED]
CASES = TF115 + NEWEST_SHARED + NEWEST_ONLY


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_expectations(case: GrapplerCase):
    """The C++ test's assertions hold for our rewrite (with ``case.ours`` named)."""
    assert_expectations(case, rewrite(case))


@pytest.mark.parametrize("case", [c for c in CASES if graph_of(c.build).runnable],
                         ids=lambda case: case.id)
def test_outputs_close(case: GrapplerCase):
    """The rewritten graph runs and computes what the original does, as in the C++ test."""
    assert_outputs_close(case)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_matches_tensorflow(case: GrapplerCase):
    """Same dtypes and Casts as TensorFlow's own pass; its departures from the test named."""
    assert_matches_tensorflow(case)
