"""Walks over a ``tf.Graph``'s operations: what a run computes, what reads an operation."""
from __future__ import annotations


def ancestors(elements, fed_names=frozenset()) -> set:
    """The operations ``elements`` (tensors, operations) depend on, themselves included,
    through data and control inputs; a tensor named in ``fed_names`` is fed, not computed."""
    return reachable([getattr(e, "op", e) for e in elements], lambda op: [
        t.op for t in op.inputs if t.name not in fed_names] + list(op.control_inputs))


def downstream_of(graph, ops) -> set:
    """``ops`` and the operations of ``graph`` that read them, directly or not (through data
    and control edges: an update in a TF1 cond waits on its pivot by a control edge)."""
    waiting = {}
    for op in graph.get_operations():
        for earlier in op.control_inputs:
            waiting.setdefault(earlier, []).append(op)
    return reachable(ops, lambda op: [consumer for output in op.outputs
                                      for consumer in output.consumers()] + waiting.get(op, []))


def value_consumers(op) -> list:
    """The operations reading an output of ``op`` as a value: not as a TF1 cond's predicate
    (what a branch computes is not computed from it), nor by a control edge."""
    return [consumer for output in op.outputs for consumer in output.consumers()
            if not (consumer.type in ("Switch", "RefSwitch") and consumer.inputs[1] is output
                    and consumer.inputs[0] is not output)]


def reachable(ops, neighbours) -> set:
    """``ops`` and every operation reached from them through ``neighbours(op)``."""
    stack, seen = list(ops), set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(neighbours(op))
    return seen


def computed_only_from(tensor, is_source, may_pass, most=None) -> bool:
    """Whether ``tensor`` is computed from sources alone: every operation up from it is a
    source (``is_source(op)``, not walked past) or one with inputs that ``may_pass(op)``;
    False too once more than ``most`` operations were looked at."""
    stack, seen = [tensor.op], set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if most is not None and len(seen) > most:
            return False
        if is_source(op):
            continue
        if not op.inputs or not may_pass(op):
            return False
        stack.extend(t.op for t in op.inputs)
    return True
