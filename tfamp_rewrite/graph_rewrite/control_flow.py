"""Which nodes of a graph run inside TF1 control flow: a while loop's frame or a cond branch.

Their values cannot be fetched from outside (TensorFlow refuses, or the run fails with
"Retval does not have value"), so the doctor's probes and the session's checks leave them
out.  An imported GraphDef carries no control-flow contexts, so they are found from the
graph alone.  Every node's context is the deepest of its inputs' -- control inputs
included: TF1 gives an op with no inputs inside a branch or loop a control input from its
pivot -- and::

    Enter                    opens a frame (a while loop)
    Exit                     closes the innermost frame
    Switch, not a loop's     opens a branch (a cond)
    Merge, not a loop's      closes the innermost branch

A loop's Switch (its predicate a ``LoopCond``) and Merge (fed by a ``NextIteration``) stay in
the frame its Enter opened.  Nodes are visited producers first, leaving out a loop's back
edge (``NextIteration`` into ``Merge``).  Nesting is followed exactly: the nodes after an
inner cond's Merge are still in the outer branch, those after an inner loop's Exit still in
the outer loop.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

IN_LOOP = "in a while loop"
IN_BRANCH = "in a cond branch"
_ENTER = frozenset({"Enter", "RefEnter"})
_EXIT = frozenset({"Exit", "RefExit"})
_SWITCH = frozenset({"Switch", "RefSwitch"})
_MERGE = frozenset({"Merge", "RefMerge"})
_NEXT_ITERATION = frozenset({"NextIteration", "RefNextIteration"})
_FRAME, _BRANCH = "frame", "branch"


def control_flow_of(ops: Sequence[str], inputs: Sequence[Sequence[int]]) -> Dict[int, str]:
    """``{node: IN_LOOP or IN_BRANCH}`` for the nodes inside TF1 control flow.

    ``ops[i]`` is node ``i``'s op type; ``inputs[i]`` the nodes it reads, data inputs first in
    port order, then control inputs (a loop's Switch is told by its input 1, the predicate).
    """
    contexts: List[Tuple[str, ...]] = [()] * len(ops)
    for i in producers_first(ops, inputs):
        op, sources = ops[i], inputs[i]
        loop_merge = op in _MERGE and any(ops[s] in _NEXT_ITERATION for s in sources)
        if loop_merge:  # its back edge is left out: the Enter's frame is its context
            sources = [s for s in sources if ops[s] not in _NEXT_ITERATION]
        context = max((contexts[s] for s in sources), key=len, default=())
        if op in _ENTER:
            context += (_FRAME,)
        elif op in _EXIT:
            context = _closed(context, _FRAME)
        elif op in _SWITCH and not (len(sources) > 1 and ops[sources[1]] == "LoopCond"):
            context += (_BRANCH,)
        elif op in _MERGE and not loop_merge:
            context = _closed(context, _BRANCH)
        contexts[i] = context
    return {i: IN_LOOP if _FRAME in context else IN_BRANCH
            for i, context in enumerate(contexts) if context}


def graph_def_inputs(graph_def) -> Tuple[List[str], List[List[int]]]:
    """``(ops, inputs)`` of a GraphDef for ``control_flow_of`` (inputs naming no node of it,
    as in a function body's argument, are left out)."""
    index = {node.name: i for i, node in enumerate(graph_def.node)}
    ops = [node.op for node in graph_def.node]
    inputs = [[index[name] for name in (text.lstrip("^").split(":")[0] for text in node.input)
               if name in index] for node in graph_def.node]
    return ops, inputs


def tf_graph_inputs(operations) -> Tuple[List[str], List[List[int]]]:
    """``(ops, inputs)`` of ``tf.Operation``s for ``control_flow_of``: a graph's, or the
    ancestors a run computes (inputs from other operations, such as fed ones, left out)."""
    index = {op: i for i, op in enumerate(operations)}
    ops = [op.type for op in operations]
    inputs = [[index[p] for p in [t.op for t in op.inputs] + list(op.control_inputs) if p in index]
              for op in operations]
    return ops, inputs


def _closed(context: Tuple[str, ...], kind: str) -> Tuple[str, ...]:
    """``context`` without its innermost ``kind`` and what opened inside it."""
    for depth in range(len(context) - 1, -1, -1):
        if context[depth] == kind:
            return context[:depth]
    return context  # malformed: nothing of that kind is open


def producers_first(ops: Sequence[str], inputs: Sequence[Sequence[int]]) -> List[int]:
    """Every node, producers before consumers, a NextIteration's edges left out (Kahn's
    algorithm; nodes on other cycles, which a valid graph has none of, come last)."""
    readers: List[List[int]] = [[] for _ in ops]
    pending = [0] * len(ops)
    for i, sources in enumerate(inputs):
        for s in sources:
            if ops[s] not in _NEXT_ITERATION:
                readers[s].append(i)
                pending[i] += 1
    ready = [i for i in range(len(ops)) if pending[i] == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for r in readers[i]:
            pending[r] -= 1
            if pending[r] == 0:
                ready.append(r)
    placed = set(order)
    return order + [i for i in range(len(ops)) if i not in placed]
