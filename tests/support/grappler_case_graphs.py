"""The graphs of Grappler's ``auto_mixed_precision_test.cc``, rebuilt with ``tf.raw_ops``.

Each builder returns a ``CaseGraph``: the GraphDef, the nodes the C++ test fetches and
the values it feeds when it evaluates the graph.  Node names follow the newest test file
(``allow1``/``infer1``/``deny1``/``clr1``); TensorFlow 1.15's file calls the same nodes
``wht1``/``gry1``/``blk1``/``clr1``.  Where a graph had to change to run here, the
builder's docstring says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2

raw = tf.raw_ops
tf1 = tf.compat.v1
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"


@dataclass
class CaseGraph:
    """A test graph: what the C++ test fetches, and what it feeds when it evaluates."""

    graph_def: graph_pb2.GraphDef
    fetches: Tuple[str, ...]
    feed_values: Dict[str, np.ndarray] = field(default_factory=dict)
    runnable: bool = True   # False: the C++ test does not execute it either


def _graph_def(body: Callable[[], None], device: str = "") -> graph_pb2.GraphDef:
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        body()
    return graph.as_graph_def()


def _const(name, value, shape, dtype=tf.float32):
    return tf.constant(value, dtype=dtype, shape=shape, name=name)


def _fill(shape, low, high, seed=0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


# --- AutoMixedPrecisionTest (TF 1.15 and newest) ---------------------------------------

def no_op() -> CaseGraph:
    """input -> Exp deny1 -> Relu clr1 -> Sqrt infer1 -> Relu clr2 -> fetch: no allow op."""
    def body():
        deny1 = raw.Exp(x=_const("input", 1.234, [32]), name="deny1")
        infer1 = raw.Sqrt(x=raw.Relu(features=deny1, name="clr1"), name="infer1")
        raw.Identity(input=raw.Relu(features=infer1, name="clr2"), name="fetch")
    return CaseGraph(_graph_def(body), ("fetch",))


def already_low_precision(low=tf.float16, device="") -> CaseGraph:
    """Cast cst1(->low) -> MatMul allow1 -> Relu clr1 -> Cast cst2(->float) -> Relu clr2."""
    def body():
        cst1 = raw.Cast(x=_const("input", 1.0, [32, 32]), DstT=low, name="cst1")
        clr1 = raw.Relu(features=raw.MatMul(a=cst1, b=cst1, name="allow1"), name="clr1")
        clr2 = raw.Relu(features=raw.Cast(x=clr1, DstT=tf.float32, name="cst2"), name="clr2")
        raw.Identity(input=clr2, name="fetch")
    return CaseGraph(_graph_def(body, device), ("fetch",))


def simple(device="") -> CaseGraph:
    """deny1 Exp -> clr1 -> infer1 Sqrt -> clr2 -> allow1 MatMul -> clr3 -> infer2 Log ->
    clr4 -> deny2 SparseMatMul (in no list) -> clr5 -> fetch.  (TF 1.15 calls Log and
    SparseMatMul blk2 and blk3, the bf16 file deny2 and deny3.)"""
    def body():
        deny1 = raw.Exp(x=_const("input", 1.0 / 32, [32, 32]), name="deny1")
        infer1 = raw.Sqrt(x=raw.Relu(features=deny1, name="clr1"), name="infer1")
        clr2 = raw.Relu(features=infer1, name="clr2")
        clr3 = raw.Relu(features=raw.MatMul(a=clr2, b=clr2, name="allow1"), name="clr3")
        infer2 = raw.Log(x=clr3, name="infer2")
        clr4 = raw.Relu(features=infer2, name="clr4")
        sparse = raw.SparseMatMul(a=clr4, b=clr4, name="deny2")
        raw.Identity(input=raw.Relu(features=sparse, name="clr5"), name="fetch")
    return CaseGraph(_graph_def(body, device), ("fetch",))


def bidirectional_clear_chain() -> CaseGraph:
    """clr1, clr2 = Relu(input); allow1 = MatMul(clr1, clr1); ShapeN clr3(clr1, clr2);
    clr4 = Relu(clr2); fetches Identity(allow1), Identity(clr4)."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        clr1, clr2 = raw.Relu(features=x, name="clr1"), raw.Relu(features=x, name="clr2")
        allow1 = raw.MatMul(a=clr1, b=clr1, name="allow1")
        raw.ShapeN(input=[clr1, clr2], name="clr3")
        raw.Identity(input=allow1, name="fetch1")
        raw.Identity(input=raw.Relu(features=clr2, name="clr4"), name="fetch2")
    return CaseGraph(_graph_def(body), ("fetch1", "fetch2"))


def preserve_fetches() -> CaseGraph:
    """allow1 -> clr1 -> infer1 -> deny1 -> clr2 -> allow2 -> clr3 -> deny2 -> clr4, with
    allow1, clr2 and clr3 fetched."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        clr1 = raw.Relu(features=raw.MatMul(a=x, b=x, name="allow1"), name="clr1")
        deny1 = raw.Exp(x=raw.Sqrt(x=clr1, name="infer1"), name="deny1")
        clr2 = raw.Relu(features=deny1, name="clr2")
        clr3 = raw.Relu(features=raw.MatMul(a=clr2, b=clr2, name="allow2"), name="clr3")
        raw.Relu(features=raw.Exp(x=clr3, name="deny2"), name="clr4")
    return CaseGraph(_graph_def(body), ("allow1", "clr2", "clr3"))


def preserve_cpu_nodes() -> CaseGraph:
    """clr1 -> allow1 -> Tanh infer1 -> allow2 (placed on CPU:0) -> clr2 -> fetch."""
    def body():
        clr1 = raw.Relu(features=_const("input", 1.0 / 32, [32, 32]), name="clr1")
        infer1 = raw.Tanh(x=raw.MatMul(a=clr1, b=clr1, name="allow1"), name="infer1")
        with tf.device(CPU0):
            allow2 = raw.MatMul(a=infer1, b=infer1, name="allow2")
        raw.Identity(input=raw.Relu(features=allow2, name="clr2"), name="fetch")
    return CaseGraph(_graph_def(body), ("fetch",))


def preserve_identity_after_variable() -> CaseGraph:
    """VariableV2 var1 -> Identity clr1 -> allow1; Const input2 -> Identity clr2 -> allow2.
    var1 is fed when the graph is evaluated."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        var1 = raw.VariableV2(shape=[32, 32], dtype=tf.float32, name="var1")
        allow1 = raw.MatMul(a=x, b=raw.Identity(input=var1, name="clr1"), name="allow1")
        clr2 = raw.Identity(input=_const("input2", 1.0 / 32, [32, 32]), name="clr2")
        allow2 = raw.MatMul(a=x, b=clr2, name="allow2")
        raw.Identity(input=allow1, name="fetch1")
        raw.Identity(input=allow2, name="fetch2")
    return CaseGraph(_graph_def(body), ("fetch1", "fetch2"),
                     {"var1:0": np.full([32, 32], 3.141593, np.float32)})


def fused_batch_norm() -> CaseGraph:
    """Conv2D allow1 -> FusedBatchNorm fbn1 -> FusedBatchNormGrad bng1 -> Add infer1(fbn1,
    bng1) -> Conv2D allow2 -> fetch (NHWC).  The input is [2, 8, 8, 16] instead of
    [8, 56, 56, 16]: the colouring does not depend on it, and fp16 convolutions are slow
    on a CPU."""
    def body():
        x = _const("input", 1.0 / 32, [2, 8, 8, 16])
        weight = _const("weight", 2.0, [3, 3, 16, 16])
        scale, offset = _const("scale", 3.0, [16]), _const("offset", 4.0, [16])
        mean, variance = _const("mean", 5.0, [0]), _const("variance", 6.0, [0])
        conv = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NHWC")
        allow1 = raw.Conv2D(input=x, filter=weight, name="allow1", **conv)
        fbn1 = raw.FusedBatchNorm(x=allow1, scale=scale, offset=offset, mean=mean,
                                  variance=variance, data_format="NHWC", name="fbn1")
        bng1 = raw.FusedBatchNormGrad(y_backprop=fbn1.y, x=allow1, scale=scale,
                                      reserve_space_1=fbn1.reserve_space_1,
                                      reserve_space_2=fbn1.reserve_space_2,
                                      data_format="NHWC", name="bng1")
        infer1 = raw.Add(x=fbn1.y, y=bng1.x_backprop, name="infer1")
        raw.Identity(input=raw.Conv2D(input=infer1, filter=weight, name="allow2", **conv),
                     name="fetch")
    return CaseGraph(_graph_def(body), ("fetch",))


def repeated_and_list_type_attrs() -> CaseGraph:
    """allow1 -> IdentityN clr1(allow1 x3) -> AddN infer1 -> allow2 -> fetch."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        allow1 = raw.MatMul(a=x, b=x, name="allow1")
        clr1 = raw.IdentityN(input=[allow1, allow1, allow1], name="clr1")
        infer1 = raw.AddN(inputs=list(clr1), name="infer1")
        raw.Identity(input=raw.MatMul(a=infer1, b=infer1, name="allow2"), name="fetch")
    return CaseGraph(_graph_def(body), ("fetch",))


def existing_cast() -> CaseGraph:
    """Const bool -> Cast cst1(->float) -> MatMul allow1 -> fetch."""
    def body():
        cst1 = raw.Cast(x=_const("input", True, [32, 32], tf.bool), DstT=tf.float32, name="cst1")
        raw.Identity(input=raw.MatMul(a=cst1, b=cst1, name="allow1"), name="fetch")
    return CaseGraph(_graph_def(body), ("fetch",))


def recurrent_edge_color_mismatch() -> CaseGraph:
    """deny1 -> Enter ent1 -> Merge mrg1(ent1, nxt1) -> Switch swt1 (constant-false loop
    condition); true branch infer1 -> allow1 -> NextIteration nxt1; false branch Exit ext1
    -> fetch; a second Merge mrg2(ent1, nxt1) reads the same NextIteration."""
    def body():
        deny1 = raw.Exp(x=_const("input", 1.0 / 32, [32, 32]), name="deny1")
        ent1 = raw.Enter(data=deny1, frame_name="loop1", name="ent1")
        mrg1 = raw.Merge(inputs=[ent1, ent1], name="mrg1")
        lpc1 = raw.LoopCond(input=_const("con1", False, [], tf.bool), name="lpc1")
        swt1 = raw.Switch(data=mrg1.output, pred=lpc1, name="swt1")
        infer1 = raw.Sqrt(x=swt1.output_true, name="infer1")
        nxt1 = raw.NextIteration(data=raw.MatMul(a=infer1, b=infer1, name="allow1"), name="nxt1")
        raw.Identity(input=raw.Exit(data=swt1.output_false, name="ext1"), name="fetch")
        raw.Merge(inputs=[ent1, nxt1], name="mrg2")
    graph_def = _graph_def(body)
    nodes = {node.name: node for node in graph_def.node}
    nodes["mrg1"].input[1] = "nxt1"        # close the loop
    nodes["con1"].input.append("^mrg1")    # keep the condition inside the frame
    return CaseGraph(graph_def, ("fetch",))


def tensor_array() -> CaseGraph:
    """TF 1.15: ta1 written with input and allow1, read -> Tanh infer1 -> allow2 -> written
    and read again -> fetch1; a separate ta2 written with input and read -> fetch2."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        idx = {i: _const("idx%d" % i, i, [], tf.int32) for i in (1, 2, 3)}

        def write(ta, i, value, name):   # every write starts from the array's own flow
            return raw.TensorArrayWriteV3(handle=ta.handle, index=idx[i], value=value,
                                          flow_in=ta.flow, name=name)

        def read(ta, i, flow, name):
            return raw.TensorArrayReadV3(handle=ta.handle, index=idx[i], flow_in=flow,
                                         dtype=tf.float32, name=name)

        ta1 = raw.TensorArrayV3(size=8, dtype=tf.float32, name="ta1")
        write(ta1, 1, x, "ta1w1")
        allow1 = raw.MatMul(a=x, b=x, name="allow1")
        infer1 = raw.Tanh(x=read(ta1, 2, write(ta1, 2, allow1, "ta1w2"), "ta1r1"), name="infer1")
        allow2 = raw.MatMul(a=infer1, b=infer1, name="allow2")
        raw.Identity(input=read(ta1, 3, write(ta1, 3, allow2, "ta1w3"), "ta1r2"), name="fetch1")
        ta2 = raw.TensorArrayV3(size=8, dtype=tf.float32, name="ta2")
        raw.Identity(input=read(ta2, 1, write(ta2, 1, x, "ta2w1"), "ta2r1"), name="fetch2")
    return CaseGraph(_graph_def(body), ("fetch1", "fetch2"))


def stack_v2() -> CaseGraph:
    """TF 1.15, never executed (the pops are unordered with the pushes): stack1 pushed with
    input and allow1, popped -> Tanh infer1 -> allow2 -> pushed; a separate stack2 pushed
    with input and popped.  No fetches.  The C++ test builds the nodes by hand and feeds a
    valueless float Const into ``max_size``; these are complete nodes with an int32
    ``max_size``, which TensorFlow's own pass needs to import the graph."""
    def body():
        x = tf1.placeholder(tf.float32, name="input")
        stacks = {}
        for suffix in ("1", "2"):
            size = _const("handle" + suffix, 8, [], tf.int32)
            stacks[suffix] = raw.StackV2(max_size=size, elem_type=tf.float32, name="stack" + suffix)
        raw.StackPushV2(handle=stacks["1"], elem=x, name="psh1")
        raw.StackPushV2(handle=stacks["1"], elem=raw.MatMul(a=x, b=x, name="allow1"), name="psh2")
        infer1 = raw.Tanh(x=raw.StackPopV2(handle=stacks["1"], elem_type=tf.float32, name="pop1"),
                          name="infer1")
        raw.StackPushV2(handle=stacks["1"], elem=raw.MatMul(a=infer1, b=infer1, name="allow2"),
                        name="psh3")
        raw.StackPushV2(handle=stacks["2"], elem=x, name="psh1-2")
        raw.StackPopV2(handle=stacks["2"], elem_type=tf.float32, name="pop1-2")
    return CaseGraph(_graph_def(body), (), runnable=False)


def batch_mat_mul() -> CaseGraph:
    """Const [64, 32, 32] -> BatchMatMul allow1 -> fetch1."""
    def body():
        x = _const("input", 1.0 / 33, [64, 32, 32])
        raw.Identity(input=raw.BatchMatMul(x=x, y=x, name="allow1"), name="fetch1")
    return CaseGraph(_graph_def(body), ("fetch1",))


# --- TensorList cases (newest) ---------------------------------------------------------

def _element_shape(dims=(32, 32)):
    return tf.constant(list(dims), tf.int32)


def _empty_list(shape, name):
    return raw.EmptyTensorList(element_shape=shape, max_num_elements=8,
                               element_dtype=tf.float32, name=name)


def _pop_back(handle, shape, name):
    return raw.TensorListPopBack(input_handle=handle, element_shape=shape,
                                 element_dtype=tf.float32, name=name).tensor


def tensor_list_set_get(device="", infer_op="Tanh") -> CaseGraph:
    """tl1 = Reserve; SetItem tl1w1(input), tl1w2(allow1); Resize; GetItem tl1r1 -> infer1
    (Tanh; Mul in the bf16 file) -> allow2 -> SetItem tl1w3 -> GetItem tl1r2 -> fetch1; a
    separate tl2 with SetItem tl2w1(input) -> GetItem tl2r1 -> fetch2."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        idx = {i: _const("idx%d" % i, i, [], tf.int32) for i in (1, 2, 3)}
        shape = _element_shape()

        def reserve(name):
            return raw.TensorListReserve(element_shape=shape, num_elements=8,
                                         element_dtype=tf.float32, name=name)

        def set_item(handle, i, item, name):
            return raw.TensorListSetItem(input_handle=handle, index=idx[i], item=item, name=name)

        def get_item(handle, i, name):
            return raw.TensorListGetItem(input_handle=handle, index=idx[i], element_shape=shape,
                                         element_dtype=tf.float32, name=name)

        tl1 = reserve("tl1")
        set_item(tl1, 1, x, "tl1w1")
        allow1 = raw.MatMul(a=x, b=x, name="allow1")
        tl1rs = raw.TensorListResize(input_handle=set_item(tl1, 2, allow1, "tl1w2"), size=6,
                                     name="tl1rs")
        tl1r1 = get_item(tl1rs, 2, "tl1r1")
        infer1 = (raw.Tanh(x=tl1r1, name="infer1") if infer_op == "Tanh"
                  else raw.Mul(x=tl1r1, y=tl1r1, name="infer1"))
        allow2 = raw.MatMul(a=infer1, b=infer1, name="allow2")
        raw.Identity(input=get_item(set_item(tl1, 3, allow2, "tl1w3"), 3, "tl1r2"), name="fetch1")
        tl2 = reserve("tl2")
        raw.Identity(input=get_item(set_item(tl2, 1, x, "tl2w1"), 1, "tl2r1"), name="fetch2")
    return CaseGraph(_graph_def(body, device), ("fetch1", "fetch2"))


def tensor_list_push_pop() -> CaseGraph:
    """As tensor_list_set_get with EmptyTensorList / PushBack / PopBack."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        shape = _element_shape()

        def push(handle, tensor, name):
            return raw.TensorListPushBack(input_handle=handle, tensor=tensor, name=name)

        tl1 = _empty_list(shape, "tl1")
        allow1 = raw.MatMul(a=x, b=x, name="allow1")
        tl1w2 = push(push(tl1, x, "tl1w1"), allow1, "tl1w2")
        infer1 = raw.Tanh(x=_pop_back(tl1w2, shape, "tl1r1"), name="infer1")
        allow2 = raw.MatMul(a=infer1, b=infer1, name="allow2")
        tl1w3 = push(tl1, allow2, "tl1w3")
        tl2w1 = push(_empty_list(shape, "tl2"), x, "tl2w1")
        raw.Identity(input=_pop_back(tl1w3, shape, "tl1r2"), name="fetch1")
        raw.Identity(input=_pop_back(tl2w1, shape, "tl2r1"), name="fetch2")
    return CaseGraph(_graph_def(body), ("fetch1", "fetch2"))


def tensor_list_from_tensor() -> CaseGraph:
    """allow1 -> FromTensor tl1 -> Stack tl1r1 -> Tanh infer1 -> allow2 -> fetch1; an
    unfetched FromTensor tl2(allow1) -> PushBack tl2w1(input) must follow tl2's colour."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        shape = _element_shape([32])
        allow1 = raw.MatMul(a=x, b=x, name="allow1")
        tl1 = raw.TensorListFromTensor(tensor=allow1, element_shape=shape, name="tl1")
        tl1r1 = raw.TensorListStack(input_handle=tl1, element_shape=shape,
                                    element_dtype=tf.float32, name="tl1r1")
        infer1 = raw.Tanh(x=tl1r1, name="infer1")
        raw.Identity(input=raw.MatMul(a=infer1, b=infer1, name="allow2"), name="fetch1")
        tl2 = raw.TensorListFromTensor(tensor=allow1, element_shape=shape, name="tl2")
        raw.TensorListPushBack(input_handle=tl2, tensor=x, name="tl2w1")
    return CaseGraph(_graph_def(body), ("fetch1",))


def tensor_list_push_back_batch_and_concat_lists() -> CaseGraph:
    """Pack(tl1, tl2) -> PushBackBatch(Pack(allow1, allow1)) -> Split -> Reshape x2 ->
    ConcatLists tl3 -> PopBack tl3r1 -> Tanh infer1 -> allow2 -> fetch1."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        shape = _element_shape()
        allow1 = raw.MatMul(a=x, b=x, name="allow1")
        handles = raw.Pack(values=[_empty_list(shape, "tl1"), _empty_list(shape, "tl2")],
                           name="tl1_tl2")
        items = raw.Pack(values=[allow1, allow1], name="allow1_allow1")
        tl12w1 = raw.TensorListPushBackBatch(input_handles=handles, tensor=items, name="tl12w1")
        parts = raw.Split(axis=0, value=tl12w1, num_split=2, name="tl12w1_outputs")
        scalar_shape = _const("scalar_shape", 0, [0], tf.int32)
        part0 = raw.Reshape(tensor=parts[0], shape=scalar_shape, name="tl12w1_output0")
        part1 = raw.Reshape(tensor=parts[1], shape=scalar_shape, name="tl12w1_output1")
        tl3 = raw.TensorListConcatLists(input_a=part0, input_b=part1,
                                        element_dtype=tf.float32, name="tl3")
        infer1 = raw.Tanh(x=_pop_back(tl3, shape, "tl3r1"), name="infer1")
        raw.Identity(input=raw.MatMul(a=infer1, b=infer1, name="allow2"), name="fetch1")
    return CaseGraph(_graph_def(body), ("fetch1",))


def _func1() -> function_pb2.FunctionDef:
    """Func1(ihandle: variant, x: float) -> (ohandle, y): PushBack then PopBack."""
    fdef = function_pb2.FunctionDef()
    signature = fdef.signature
    signature.name = "Func1"
    for name, dtype in (("ihandle", tf.variant), ("x", tf.float32)):
        signature.input_arg.add(name=name, type=dtype.as_datatype_enum)
    for name, dtype in (("ohandle", tf.variant), ("y", tf.float32)):
        signature.output_arg.add(name=name, type=dtype.as_datatype_enum)

    def node(name, op, inputs, **attrs):
        new = fdef.node_def.add(name=name, op=op)
        new.input.extend(inputs)
        for attr, value in attrs.items():
            if isinstance(value, tf.DType):
                new.attr[attr].type = value.as_datatype_enum
            else:
                new.attr[attr].tensor.CopyFrom(value)

    node("tl1w1_handle", "TensorListPushBack", ["ihandle", "x"], element_dtype=tf.float32)
    node("shape", "Const", [], dtype=tf.int32, value=tf.make_tensor_proto([32, 32], tf.int32))
    node("tl1r1_handle", "TensorListPopBack", ["tl1w1_handle:output_handle:0", "shape:output:0"],
         element_dtype=tf.float32)
    node("ohandle", "Identity", ["tl1r1_handle:output_handle:0"], T=tf.variant)
    node("y", "Identity", ["tl1r1_handle:tensor:0"], T=tf.float32)
    fdef.ret["ohandle"] = "ohandle:output:0"
    fdef.ret["y"] = "y:output:0"
    return fdef


def tensor_list_through_function() -> CaseGraph:
    """tl1's handle passes through a call of library function Func1 (which has its own
    TensorList ops), so the tl1 cluster must stay as it is; the separate tl2 cluster
    between infer1 and allow2 still becomes half."""
    def body():
        x = _const("input", 1.0 / 32, [32, 32])
        shape = _element_shape()
        infer1 = raw.Tanh(x=raw.MatMul(a=x, b=x, name="allow1"), name="infer1")
        tl1w1 = raw.TensorListPushBack(input_handle=_empty_list(shape, "tl1"), tensor=infer1,
                                       name="tl1w1")
        tl2w1 = raw.TensorListPushBack(input_handle=_empty_list(shape, "tl2"), tensor=infer1,
                                       name="tl2w1")
        func1 = tf.identity(tl1w1, name="Func1")   # becomes the call, below
        tl1r1 = _pop_back(func1, shape, "tl1r1")
        tl2r1 = _pop_back(tl2w1, shape, "tl2r1")
        raw.Identity(input=raw.MatMul(a=tl1r1, b=tl2r1, name="allow2"), name="fetch1")
    graph_def = _graph_def(body)
    graph_def.library.function.add().CopyFrom(_func1())
    call = next(node for node in graph_def.node if node.name == "Func1")   # Func1(tl1w1, infer1)
    call.op = "Func1"
    call.input.append("infer1")
    call.attr.clear()
    return CaseGraph(graph_def, ("fetch1",))


# --- unary infer ops between two MatMuls (newest) --------------------------------------

UNARY_INFER_OPS = {
    # op: (input low, input high, atol, rtol) of TestSimpleUnaryInferOp; None = float eps
    "Elu": (-5, 5, 1e-3, 1e-3),
    "Erf": (-5, 5, 1e-3, None),
    "Erfc": (-5, 5, 1e-3, None),
    "Inv": (0.01, 10, None, 1e-3),
    "Log": (0.01, 10, 1e-3, 2e-3),
    "Log1p": (-0.99, 9, 1e-3, 5e-3),
    "LogSoftmax": (-8, 8, None, 1e-2),
    "Reciprocal": (0.01, 10, None, 1e-3),
    "Sigmoid": (-5, 5, 1e-3, None),
    "Softmax": (-8, 8, 2e-3, None),
    "Softplus": (-5, 5, 1e-3, 1e-3),
    "Sqrt": (0, 10, 1e-3, 1e-3),
    "Tanh": (-5, 5, 1e-3, None),
}


def unary_infer(op: str) -> CaseGraph:
    """Placeholder input -> MatMul allow1(input, eye) -> OP infer1 -> MatMul allow2(infer1,
    eye) -> fetch1, with a 128x128 identity ``eye``; input fed from OP's range."""
    size = 128
    low, high = UNARY_INFER_OPS[op][:2]

    def body():
        eye = tf.constant(np.eye(size, dtype=np.float32), name="eye")
        x = tf1.placeholder(tf.float32, name="input")
        allow1 = raw.MatMul(a=x, b=eye, name="allow1")
        argument = "features" if op in ("Elu", "Softplus") else (
            "logits" if op in ("LogSoftmax", "Softmax") else "x")
        infer1 = getattr(raw, op)(**{argument: allow1, "name": "infer1"})
        raw.Identity(input=raw.MatMul(a=infer1, b=eye, name="allow2"), name="fetch1")
    return CaseGraph(_graph_def(body), ("fetch1",), {"input:0": _fill([size, size], low, high)})


# --- AutoMixedPrecisionCpuTest / MklTest (newest) ----------------------------------------

def mixed_fanout() -> CaseGraph:
    """allow1 = MatMul(input1, input2); allow2 = MatMul(allow1, input2); deny = Exp(allow1);
    infer = Add(deny, allow2) -> fetch; all on CPU:0."""
    def body():
        input2 = _const("input2", 2.0 / 32, [32, 32])
        allow1 = raw.MatMul(a=_const("input1", 1.0 / 32, [32, 32]), b=input2, name="allow1")
        allow2 = raw.MatMul(a=allow1, b=input2, name="allow2")
        infer = raw.Add(x=raw.Exp(x=allow1, name="deny"), y=allow2, name="infer")
        raw.Identity(input=infer, name="fetch")
    return CaseGraph(_graph_def(body, CPU0), ("fetch",))


def infer_follow_up_stream(first: str) -> CaseGraph:
    """``allow``: Conv2D allow -> BiasAdd infer -> Relu clr -> fetch; ``deny``: Pow deny ->
    BiasAdd infer -> Relu clr -> fetch.  All on CPU:0."""
    def body():
        x = _const("input1", 1.0 / 32, [8, 56, 56, 16])
        if first == "allow":
            weight = _const("weight", 2.0, [3, 3, 16, 16])
            head = raw.Conv2D(input=x, filter=weight, strides=[1, 1, 1, 1], padding="SAME",
                              data_format="NHWC", name="allow")
            bias = _const("input2", 1.0 / 32, [16])
        else:
            head = raw.Pow(x=x, y=_const("input2", 1.0, [16]), name="deny")
            bias = _const("input3", 1.0 / 32, [16])
        infer = raw.BiasAdd(value=head, bias=bias, name="infer")
        raw.Identity(input=raw.Relu(features=infer, name="clr"), name="fetch")
    return CaseGraph(_graph_def(body, CPU0), ("fetch",))
