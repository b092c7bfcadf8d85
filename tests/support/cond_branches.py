"""Which nodes run only when a data-dependent cond says so, in either control flow.

Control flow v2 (TF2 behaviour) puts a cond's branches in functions called by an ``If`` /
``StatelessIf`` node; control flow v1 (TF1 behaviour) routes the branches through
``Switch`` nodes on the predicate and joins them at ``Merge``.  A cond on a constant (as
Horovod wraps each collective for process-set membership) is not data-dependent.
"""
from __future__ import annotations

import collections
from typing import List, Tuple


def _name(text: str) -> str:
    return text.lstrip("^").split(":")[0]


def nodes_in_data_dependent_conds(graph_def) -> Tuple[int, List[str]]:
    """``(number of data-dependent conds, names of the nodes inside their branches)``."""
    producers = {node.name: node for node in graph_def.node}
    count, inside = _v2(graph_def, producers)
    count_v1, inside_v1 = _v1(graph_def, producers)
    return count + count_v1, inside + inside_v1


def _v2(graph_def, producers):
    functions = {f.signature.name: f for f in graph_def.library.function}

    def nodes(function_name):
        found = []
        for node in functions[function_name].node_def:
            found.append(node.name)
            for value in node.attr.values():
                for called in [value.func] + list(value.list.func):
                    if called.name in functions:
                        found += nodes(called.name)
        return found

    conds = [node for node in graph_def.node if node.op in ("If", "StatelessIf")
             and producers[_name(node.input[0])].op != "Const"]
    inside = [name for node in conds for branch in ("then_branch", "else_branch")
              for name in nodes(node.attr[branch].func.name)]
    return len(conds), inside


def _v1(graph_def, producers):
    """Nodes reachable from a data-dependent cond's Switch nodes before their Merge."""
    consumers = collections.defaultdict(list)
    for node in graph_def.node:
        for text in node.input:
            consumers[_name(text)].append(node)
    def predicate_source(text):
        node = producers[_name(text)]
        while node.op == "Identity":  # a cond's pred_id
            node = producers[_name(node.input[0])]
        return node

    switches = [node for node in graph_def.node if node.op in ("Switch", "RefSwitch")
                and predicate_source(node.input[1]).op not in ("Const", "LoopCond")]
    inside, stack = set(), [node.name for node in switches]
    while stack:
        for consumer in consumers[stack.pop()]:
            if consumer.op in ("Merge", "RefMerge", "Exit", "RefExit") or consumer.name in inside:
                continue
            inside.add(consumer.name)
            stack.append(consumer.name)
    return len({predicate_source(node.input[1]).name for node in switches}), sorted(inside)
