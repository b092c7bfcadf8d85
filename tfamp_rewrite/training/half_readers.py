"""The converted nodes a too-large value reaches once the nodes holding it are float32.

Keeping a culprit's half nodes float32 moves its large value on to the next converted
nodes that read it, and through nodes that pass a value's size on -- the clear list
(moves, selects, concats, max-pools) and a few infer-list ops (a bias or a sum added, an
activation that is the identity for large positive inputs) -- to theirs: a float32 sum of
a gradient, read in half by the next layer's backprop, holds it as large; a -1e9 mask
subtracted in float32 and concatenated in half is -inf there.  A heal keeps those float32
too (``half_readers``), within ``MAX_READERS_KEPT`` nodes and ``MAX_NODES_WALKED`` walked;
not the readers of its shape only (a Shape, a ZerosLike), which hold no value of it.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List

from ..doctor.probes import SHAPE_READERS

MAX_READERS_KEPT = 64  # converted nodes a culprit's value reaches that a heal also keeps float32
MAX_NODES_WALKED = 512  # nodes passing a culprit's value on that are walked to find them
PASSES_SIZE_ON = frozenset({"BiasAdd", "BiasAddV1", "Add", "AddV2", "AddN", "Sub", "Relu",
                            "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus"})


def passes_size_on(decision) -> bool:
    """Whether a node (its rewrite ``decision``) passes a large input's size on to its output."""
    return decision.category == "clear" or decision.op in PASSES_SIZE_ON


def half_readers(source: str, half_nodes: List[str], decisions: Dict[str, object],
                 readers: Callable[[str], Iterable[str]]) -> List[str]:
    """``half_nodes`` (converted nodes holding ``source``'s value), then the converted nodes
    that would read it in half once those are float32: ``source``'s and their readers, and
    theirs through nodes, half or float32, that pass its size on.  ``decisions``: node ->
    its rewrite decision; ``readers(node)``: the nodes reading its outputs."""
    kept = list(half_nodes)
    passing = [source] + [n for n in half_nodes if passes_size_on(decisions[n])]
    walked = set(passing)
    while passing and len(kept) < MAX_READERS_KEPT and len(walked) < MAX_NODES_WALKED:
        node = passing.pop(0)
        for reader in readers(node):
            decision = decisions.get(reader)
            if decision is None or decision.op in SHAPE_READERS:
                continue  # a Shape reads no value: nothing to keep float32
            if decision.converted and reader not in kept:
                kept.append(reader)
            if reader not in walked and passes_size_on(decision):
                walked.add(reader)
                passing.append(reader)
    return kept
