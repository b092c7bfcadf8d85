"""A layer's twins: the same layer under another top scope, or the same function called again.

A DQN's target network has its online network's layers under another scope, and its Q
values come from a run that infers, which is never healed; a tower has its replica's.  A
function that holds no weights and is called twice -- ``tf.image.ssim`` as the training loss
and again as an evaluation metric -- has its nodes under a scope and the same scope made
unique ("SSIM" and "SSIM_1").  When a heal keeps a node float32, the session keeps its twins
float32 too (step_watch.py).
"""
from __future__ import annotations

import re
from typing import Dict, List, Set

from .op_walks import computed_only_from, reachable
from .unscaled_training import GRADIENT_SCOPE
from .variable_check import VARIABLE_OPS

_UNIQUE_SUFFIX = re.compile(r"_\d+$")  # TensorFlow's suffix for a name scope entered again
_READ_OPS = frozenset({"Identity", "ReadVariableOp"})


def twin_nodes(graph, nodes: List[str], converted) -> List[str]:
    """The converted nodes of ``graph`` that are ``nodes``' twins: the same name past the
    first scope, the same op, and inputs of the same ops, named alike within their scopes;
    and either

    * a layer under another top scope ("online/q/MatMul" and "target/q/MatMul": the name
      past the first scope names a layer's node, and the two read that layer's variables of
      each network, or the same shared ones), or
    * the same scope entered again ("SSIM/depthwise_3" and "SSIM_1/depthwise_3";
      "siamese/h/MatMul" and "siamese_1/h/MatMul" of a network applied twice with
      ``reuse=True``) where both read the same variables: a function called twice, not
      two layers of one model ("dense/MatMul" and "dense_1/MatMul" read their own kernels).

    A run that infers with a twin (the target network's Q values, an evaluation's SSIM)
    is never healed, so its overflow is kept off with the node's."""
    by_tail: Dict[str, list] = {}
    for op in graph.get_operations():
        head, slash, tail = op.name.partition("/")
        if slash and op.name in converted:
            by_tail.setdefault(tail, []).append(op)
    twins = []
    for name in nodes:
        head, slash, tail = name.partition("/")
        if tail not in by_tail:
            continue
        try:
            op = graph.get_operation_by_name(name)
        except KeyError:
            continue
        for other in by_tail[tail]:
            other_head = other.name.partition("/")[0]
            if (other.name in nodes or other.name in twins or other.type != op.type
                    or not _alike_inputs(op, head, other, other_head)):
                continue
            if _same_scope_again(head, other_head):
                if _variables_read(op, head) == _variables_read(other, other_head):
                    twins.append(other.name)
            elif "/" in tail and _same_network_layer(op, head, other, other_head):
                twins.append(other.name)
    siblings = [name for name in weight_siblings(graph, list(nodes) + twins, converted) if name not in twins]
    kept = list(nodes) + twins + siblings
    return twins + siblings + [name for name in weight_producers(graph, kept, converted) if name not in kept]


def weight_producers(graph, nodes: List[str], converted) -> List[str]:
    """The converted nodes of ``graph`` that compute the weights ``nodes`` read (from
    constants, variables and shapes alone: ``tf.image.ssim``'s Gaussian filter tiled to the
    channels): kept float32 with them, a float32 node reads its weights at full precision,
    not rounded to half by a producer whose other readers stay half (the backward pass's
    filters)."""
    producers: List[str] = []
    for _, _, tensor in _weight_inputs(graph, nodes):
        upstream = reachable([tensor.op], lambda each: [] if each.type in _STRUCTURE
                             or each.type in VARIABLE_OPS else [t.op for t in each.inputs])
        producers += sorted(each.name for each in upstream if each.name in converted
                            and _computes_weights(each)
                            and each.name not in nodes and each.name not in producers)
    return producers


def weight_siblings(graph, nodes: List[str], converted) -> List[str]:
    """The converted nodes of ``graph`` that apply the same weights as one of ``nodes`` (of
    its op type, reading the same tensor computed from constants and variables alone) to
    other values: ``tf.image.ssim``'s Gaussian filter over x, y, x^2 + y^2 and xy -- the
    heal of the one that overflows left the others half, and the variance E[xy] - E[x]E[y]
    lost to cancellation (SSIM 0.887 for float32's 0.900) -- or a statically unrolled RNN's
    steps.  Nodes merely reading the same data (two heads over one feature map) are none."""
    siblings: List[str] = []
    for op, index, tensor in _weight_inputs(graph, nodes):
        backward = bool(GRADIENT_SCOPE.search(op.name))
        weights = _weights_key(tensor)
        for reader in _readers_of_weights(tensor):
            if (reader.type == op.type and reader.name in converted and reader.name not in nodes
                    and bool(GRADIENT_SCOPE.search(reader.name)) == backward  # a layer's dx: no sibling
                    and reader.name not in siblings and len(reader.inputs) > index
                    and _weights_key(reader.inputs[index]) == weights):
                siblings.append(reader.name)
    return siblings


def _weight_inputs(graph, nodes: List[str]):
    """``(op, input index, tensor)`` for each input of ``nodes``' ops (those ``graph`` holds)
    computed from constants, variables and shapes alone (``_weights_only``)."""
    for name in nodes:
        try:
            op = graph.get_operation_by_name(name)
        except KeyError:
            continue
        for index, tensor in enumerate(op.inputs):
            if _weights_only(tensor):
                yield op, index, tensor


def _computes_weights(op) -> bool:
    """Whether ``op`` computes floating values of its own: not a variable or its read, not a
    shape or a constant (which keep their dtype: a cast follows them)."""
    return (op.type not in _STRUCTURE and op.type not in VARIABLE_OPS and not _reads_a_variable(op)
            and any(t.dtype.is_floating for t in op.outputs))


def _weights_key(tensor):
    """What tells the same weights: a variable read's variable (a resource variable is read
    by a ReadVariableOp of its own at each use), else the tensor itself."""
    if _reads_a_variable(tensor.op):
        return tensor.op.inputs[0].op.name
    return tensor.name


def _readers_of_weights(tensor):
    """The ops reading ``tensor``, or, for a variable's read, any read of that variable."""
    if not _reads_a_variable(tensor.op):
        return list(tensor.consumers())
    return [reader for read in tensor.op.inputs[0].consumers() if _reads_a_variable(read)
            for output in read.outputs for reader in output.consumers()]


_MOST_WEIGHT_OPS = 64  # ops looked at up from a tensor to tell it is computed from weights alone


def _weights_only(tensor) -> bool:
    """Whether ``tensor`` is computed from constants, variables and shapes alone (a filter
    tiled from a constant -- a shape is no data: SSIM tiles its filter to the images'
    channels -- or a kernel's read), within ``_MOST_WEIGHT_OPS`` ops; a placeholder, an
    iterator or a random op is data."""
    return computed_only_from(tensor, lambda op: op.type in VARIABLE_OPS or op.type in _STRUCTURE,
                              lambda op: op.type not in _NOT_WEIGHTS, most=_MOST_WEIGHT_OPS)


_STRUCTURE = frozenset({"Const", "Shape", "ShapeN", "Size", "Rank"})
# Data, and what only a network's activations go through: a convolution or a pooling of a
# variable is an image optimized as a variable (neural style, DeepDream), not a weight.
# the ops a graph's data comes in by
DATA_INPUT_OPS = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext", "QueueDequeueV2",
                            "QueueDequeueManyV2", "QueueDequeueUpToV2"})
_NOT_WEIGHTS = DATA_INPUT_OPS | frozenset({
    "RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MaxPool", "MaxPoolV2", "AvgPool", "AvgPool3D", "MaxPool3D"})


def _same_network_layer(op, head: str, other, other_head: str) -> bool:
    """Whether ``op`` and ``other``, under top scopes ``head`` and ``other_head``, read the
    same layer's variables of two networks: "online/q/kernel" and "target/q/kernel" (a layer
    scope below the network's), or one shared variable (a tower's).  Two layers of one model
    ("fc1/kernel", "fc2/kernel": the top scope is the layer) are not twins, nor nodes that
    read no variable."""
    mine, theirs = _variables_read(op, head), _variables_read(other, other_head)
    if not mine or sorted(_past(v, head) for v in mine) != sorted(_past(v, other_head) for v in theirs):
        return False
    return all("/" in _past(v, head) for v in mine if v.startswith(head + "/"))


def _past(name: str, head: str) -> str:
    """``name`` past the top scope ``head``, or as it is when outside it (a shared variable)."""
    return name[len(head) + 1:] if name.startswith(head + "/") else name


def _same_scope_again(head: str, other_head: str) -> bool:
    """Whether two top scopes are one name scope made unique ("SSIM", "SSIM_1", "SSIM_2")."""
    return _UNIQUE_SUFFIX.sub("", head) == _UNIQUE_SUFFIX.sub("", other_head)


def _variables_read(op, head: str) -> Set[str]:
    """The variables ``op`` reads through the ops of its scope ``head`` (and their reads:
    ``w/read``, ``ReadVariableOp``, wherever they are)."""
    found, stack, seen = set(), [op], set()
    while stack:
        each = stack.pop()
        if each in seen:
            continue
        seen.add(each)
        if each.type in VARIABLE_OPS:
            found.add(each.name)
            continue
        stack.extend(t.op for t in each.inputs if t.op.name.startswith(head + "/")
                     or t.op.type in VARIABLE_OPS or _reads_a_variable(t.op))
    return found


def _reads_a_variable(op) -> bool:
    return op.type in _READ_OPS and bool(op.inputs) and op.inputs[0].op.type in VARIABLE_OPS


def _alike_inputs(op, head: str, other, other_head: str) -> bool:
    """Whether ``op`` (under scope ``head``) and ``other`` read the same ops, those within
    their scopes named alike there ("online/h/Relu" and "target/h/Relu"), or one tensor;
    of shapes that may be the same (a distilled student's "student/out" is no twin of its
    wider teacher's "teacher/out")."""
    if len(op.inputs) != len(other.inputs):
        return False
    for mine, theirs in zip(op.inputs, other.inputs):
        if mine.name == theirs.name:  # one tensor: a shared weight's read
            continue
        if mine.op.type != theirs.op.type or not mine.shape.is_compatible_with(theirs.shape):
            return False
        inside = mine.op.name.startswith(head + "/"), theirs.op.name.startswith(other_head + "/")
        if any(inside) and (not all(inside) or mine.op.name[len(head):] != theirs.op.name[len(other_head):]):
            return False
    return True
