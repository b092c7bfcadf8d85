"""Which half tensor makes steps skip: range probes that ride along a real training step.

``StepDiagnosis`` is built from the user's float32 graph and its rewrite with half dtypes in
it (the session's current one).  Its probes are the doctor's (``doctor.probes``): every
tensor the rewrite holds in half, with the converted nodes that hold it (``half_nodes``)
and its role (forward, or a gradient the loss scale multiplies); and every float32 output
of an unconverted node that reads a half tensor (a *boundary*); and every float32 output of
an unconverted op that can turn finite values into inf/nan (a *maker*: a division, a log;
``NONFINITE_MAKERS``).  In the session's private
graph each is measured as it is really held -- a half tensor cast to float32, an emulated
one as the float32 value emulation rounds.  ``fetches(elements, fed)`` gives the probes
the step computes anyway (never an extra run of input ops); ``find`` reads them::

    for each probed tensor, in topological order:
        no step's finite check reads it or its half nodes (a frozen layer's kernel
          gradient, built by tf.gradients and applied by no optimizer): it cannot skip a
          step; skip it (a loss's float32 Log is read by no gradient, but the half value
          it reads is)
        an input (probed) is already inf/nan:          a victim; skip it
        its producer is half and it holds inf/nan or values beyond the half range,
          or it is float32, read in half, with finite values beyond the half range:
            forward: the culprit (its half_nodes stay float32, and the converted nodes
                     that read its value in half through ones, half or float32, that pass
                     its size on: a reshape, concat, bias, sum or ReLU does, so keeping only
                     the first float32 would move the overflow one node on, one heal at a time)
            gradient: the culprit only when even unscaled it does not fit -- at the floor
                      scale, or its largest finite value over the step's scale is beyond
        it is a float32 maker that turns inf/nan from finite inputs, and what can make it
          do so (a divisor, a log's argument) no half tensor computes: float32 makes it
          too (0/0 when a batch has no positives) -- no culprit, but a *float32 origin*
          (a forward one whatever the scale, a gradient one at the floor), and what reads
          it is its victim
        it is float32 and turns inf/nan from finite inputs: a half tensor upstream lost a
            value (flushed to zero, rounded to 1) that float32 needed -- the nearest
            converted nodes up its float32 inputs (a maker's: those that can make it; at
            most FRONTIER_DEPTH nodes away) stay
            float32, under the same forward / gradient rule; unless it reads, through float32
            nodes no probe measured, a while loop's Exit: then the value came out of the loop
            unseen (a backward loop's weight gradient, summed in float32 over its iterations'
            half MatMuls), and the loop's converted nodes stay float32
    every culprit found is one: none reads another's inf/nan, each holds its own value out
    of range (as a style loss's Gram matrices do).  The finding keeps all their half nodes
    float32 in one edit, so one heal mends what one culprit per heal took as many heals for
    none: no culprit (gradients that overflow only at this scale are the scale's business);
    the finding then holds the float32 origins, if any
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..doctor.fixes import Fix, fix_for
from ..doctor.limits import HalfLimits
from ..doctor.probe_ops import NONFINITE_BIN, OVERFLOW_BIN, ProbeOps
from ..doctor.probes import (
    ACTIVATION_GRADIENT,
    FORWARD,
    NONFINITE_MAKERS,
    WEIGHT_GRADIENT,
    HalfNode,
    Probe,
    in_backward_scope,
    in_unscale_scope,
    plan_boundary_probes,
    plan_float32_maker_probes,
    plan_probes,
)
from ..graph_rewrite.graph_view import parse_input, topological_names
from .half_readers import half_readers
from .op_walks import reachable
from .while_loops import while_loops

FRONTIER_DEPTH = 6  # float32 nodes between an inf/nan and the half tensor held to blame


@dataclass
class Culprit:
    """The first tensor of a step that does not fit the half type, and who holds it in half."""

    tensor: str                  # user graph name, "node:port"
    node: str
    op: str
    role: str
    max_abs: float               # the largest |x| the step held there (inf for inf/nan)
    half_nodes: List[str]        # the converted nodes to keep float32
    held_by: str                 # "'name' (Op, infer list)" -- who holds it in half, and how
    fix: Fix                     # the list edit (and node names) that keep them float32
    # True when a float32 node turned inf/nan from finite inputs and the nearest half nodes
    # upstream are only presumed to blame (float32 itself may fail the same way)
    presumed: bool = False


@dataclass
class Float32Origin:
    """A float32 node that turned inf/nan from finite values no half tensor computes."""

    tensor: str                  # user graph name, "node:port"
    op: str
    does: str                    # what the op does with ``operands``: "divides by"
    operands: List[str]          # the inputs that can make it inf/nan ("Sum_1:0")


@dataclass
class Finding:
    """What one probed step shows: its culprits, in topological order, none of which reads
    another's inf/nan; and the one edit that keeps all their half nodes float32.  With no
    culprit, the float32 origins of its inf/nan (``find`` returns a finding for either)."""

    culprits: List[Culprit]
    half_nodes: List[str]        # every culprit's, in order, once each
    fix: Optional[Fix]
    float32_origins: List[Float32Origin] = field(default_factory=list)


class StepDiagnosis:
    """Probes of one private graph generation (see module docstring)."""

    def __init__(self, user_def, rewritten_def, report, private_graph,
                 private_name: Callable[[str], str], limits: HalfLimits):
        self.limits = limits
        self._converted = {d.name for d in report.decisions if d.converted}
        self._decisions = {d.name: d for d in report.decisions}
        self._inputs = {node.name: ["%s:%d" % parse_input(text) for text in node.input
                                    if not text.startswith("^")] for node in user_def.node}
        self._readers: Dict[str, List[str]] = {}
        for node, tensors in self._inputs.items():
            for tensor in tensors:
                self._readers.setdefault(tensor.split(":")[0], []).append(node)
        self._loops = while_loops(user_def, self._readers)
        self._checked = reachable([node.name for node in user_def.node if in_unscale_scope(node.name)],
                                  lambda node: [t.split(":")[0] for t in self._inputs.get(node, ())])
        probes = plan_probes(user_def, rewritten_def, report).probes
        held = self._held = {p.tensor for p in probes}
        self._boundaries = {p.tensor: p for p in plan_boundary_probes(user_def, report)}
        probes += [p for p in self._boundaries.values() if p.tensor not in held]
        held = held | set(self._boundaries)
        # a forward maker no finite check reads still tells why the step's loss is inf/nan
        makers = [p for p in plan_float32_maker_probes(user_def, report) if p.tensor not in held
                  and (not self._checked or p.node in self._checked or p.role == FORWARD)]
        self._makers = {p.tensor for p in makers}
        probes += makers
        self._half_fed: Optional[Set[str]] = None  # nodes a converted node's value reaches
        order = {name: i for i, name in enumerate(topological_names(user_def))}
        probes.sort(key=lambda p: (order.get(p.node, len(order)), p.tensor))
        self._by_private = {private_name(p.tensor): p for p in probes}
        self.ops = ProbeOps(private_graph, limits)
        self.ops.add([_renamed(p, private_name(p.tensor)) for p in probes])

    def fetches(self, elements: Sequence, fed=(),
                monitor_only: bool = False) -> Tuple[Tuple[int, ...], object]:
        """``(ids, tensors)``: the probes a run of ``elements`` computes, and what to fetch.

        ``monitor_only``: the precision monitor's sample, not a diagnosis -- only the outputs
        of allow and infer nodes, the layers' own values (clear ops move or select theirs).
        """
        ids = self.ops.select(elements, fed)
        if monitor_only:
            ids = tuple(i for i in ids if self.ops.probes[i].category in ("allow", "infer")
                        and self.ops.probes[i].node in self._converted)
        return ids, (self.ops.fetches(ids) if ids else None)

    def find(self, ids: Tuple[int, ...], counts, extrema, scale: float, at_floor: bool,
             nonfinite_inputs: Sequence[str] = ()) -> Optional[Finding]:
        """The culprits of the probed step, else its float32 origins, or None when it has
        neither (module docstring).
        ``nonfinite_inputs``: tensors the run was fed inf/nan in; what reads them is a victim."""
        counts, extrema = np.asarray(counts), np.asarray(extrema)
        culprits: List[Culprit] = []
        origins: List[Float32Origin] = []
        kept: Set[str] = set()  # their half nodes
        nonfinite: Dict[str, bool] = {name: True for name in nonfinite_inputs}
        for row, probe_id in sorted(enumerate(ids), key=lambda item: item[1]):
            probe = self._by_private[self.ops.probes[probe_id].tensor]
            checked = not self._checked or probe.node in self._checked or any(
                n.name in self._checked for n in probe.half_nodes)
            if not checked and probe.tensor not in self._makers:
                continue  # what reaches no finite check skips no step
            if any(self._tainted(t, nonfinite) for t in self._inputs.get(probe.node, ())):
                nonfinite[probe.tensor] = True
                continue  # a victim: what it reads is already inf/nan
            # held in half, a value beyond the half range is inf for whoever reads it
            nonfinite[probe.tensor] = int(counts[row][NONFINITE_BIN]) > 0 or (
                probe.node in self._converted and int(counts[row][OVERFLOW_BIN]) > 0)
            largest = float(extrema[row][0])
            if nonfinite[probe.tensor] and self._made_in_float32(probe):
                if probe.role == FORWARD or at_floor:  # else a lower scale may keep it finite
                    origins.append(self._float32_origin(probe))
                continue  # what reads it is its victim
            if not checked:
                continue
            found = self._judge(probe, counts[row], largest, scale, at_floor, nonfinite)
            if found is not None:
                if not set(found.half_nodes) <= kept:  # else a second output of a culprit's nodes
                    culprits.append(found)
                    kept.update(found.half_nodes)
                nonfinite[probe.tensor] = True  # what reads it is its victim, not a culprit
        if not culprits:
            # the user's own forward op (a loss's division) before what tf.gradients built of it
            origins.sort(key=lambda origin: in_backward_scope(origin.tensor))
            return Finding(culprits=[], half_nodes=[], fix=None, float32_origins=origins) if origins else None
        names = list(dict.fromkeys(n for c in culprits for n in c.half_nodes))
        return Finding(culprits=culprits, half_nodes=names,
                       fix=fix_for([self._half_node(n) for n in names]))

    def _made_in_float32(self, probe: Probe) -> bool:
        """Whether ``probe`` is a float32 maker's output (its inputs finite) whose inputs
        that can make it inf/nan no converted node's value reaches."""
        if probe.op not in NONFINITE_MAKERS or probe.node in self._converted:
            return False
        half_fed = self._nodes_half_fed()
        return not any(tensor.split(":")[0] in half_fed for tensor in self._operands(probe))

    def _operands(self, probe: Probe) -> List[str]:
        """The inputs of maker ``probe``'s node that can make it inf/nan."""
        inputs = self._inputs.get(probe.node, [])
        return [inputs[k] for k in NONFINITE_MAKERS[probe.op][0] if k < len(inputs)]

    def _float32_origin(self, probe: Probe) -> Float32Origin:
        return Float32Origin(tensor=probe.tensor, op=probe.op, does=NONFINITE_MAKERS[probe.op][1],
                             operands=self._operands(probe))

    def _nodes_half_fed(self) -> Set[str]:
        """Converted nodes and every node their values reach, through data inputs."""
        if self._half_fed is None:
            self._half_fed = reachable(self._converted, lambda node: self._readers.get(node, ()))
        return self._half_fed

    def _tainted(self, tensor: str, nonfinite: Dict[str, bool]) -> bool:
        """Whether ``tensor`` holds inf/nan this step, as far as the probes so far tell:
        its own probe, else (copies and unprobed nodes) any input's."""
        stack, seen = [tensor], set()
        while stack:
            name = stack.pop()
            if name in nonfinite:
                if nonfinite[name]:
                    return True
                continue
            node = name.split(":")[0]
            if node in seen:
                continue
            seen.add(node)
            stack.extend(self._inputs.get(node, ()))
        return False

    def _judge(self, probe: Probe, row, largest: float, scale: float, at_floor: bool,
               measured: Dict[str, bool]) -> Optional[Culprit]:
        """The culprit ``probe``'s values make it, or None (module docstring); ``measured``:
        tensor -> whether it held inf/nan this step, for the probes judged before it."""
        nonfinite, beyond = int(row[NONFINITE_BIN]), int(row[OVERFLOW_BIN])
        if probe.node in self._loops and (nonfinite > 0 or (probe.node in self._converted and beyond > 0)):
            return self._loop_culprit(probe, largest, scale, at_floor)
        boundary = None
        if probe.node in self._converted:
            out_of_range = nonfinite > 0 or beyond > 0
        elif nonfinite > 0:  # float32 turned inf/nan from finite inputs: a half tensor upstream
            loop_exit = self._loop_upstream(probe.node, measured)
            if loop_exit is not None:
                return self._loop_culprit(self._leaving(loop_exit, probe), float("inf"), scale, at_floor,
                                          into=probe.node)
            frontier = self._half_frontier(probe.node, self._operands(probe)
                                           if probe.op in NONFINITE_MAKERS else None)
            if not frontier:
                return None  # float32 all the way: no half tensor's doing
            out_of_range, boundary = True, probe
            probe = Probe(tensor=probe.tensor, node=probe.node, op=probe.op, category=None,
                          role=probe.role, half_nodes=frontier)
        elif probe.tensor in self._held:  # float32 read in half, beyond the half range
            if probe.half_nodes and all(n.op in _SLICES for n in probe.half_nodes):
                return None  # read in parts: each slice's own output is probed, and judged
            out_of_range = beyond > 0
        else:  # a float32 boundary that stayed finite: fine in float32, whatever its size
            return None
        if not out_of_range:
            return None
        if self._scale_may_fit(probe, largest, scale, at_floor):
            return None
        if boundary is not None:
            held_by = "%s, upstream of float32 %r (%s), which turns inf/nan" % (
                _names(probe.half_nodes), boundary.node, boundary.op)
        elif probe.node in self._converted:
            held_by = _names([n for n in probe.half_nodes if n.name == probe.node] or probe.half_nodes)
        else:
            held_by = "%r (%s, float32) as read in half by %s" % (
                probe.node, probe.op, _names(probe.half_nodes))
        if boundary is None:
            probe = self._with_half_readers(probe)
        return self._culprit(probe, largest, held_by, presumed=boundary is not None)

    def _scale_may_fit(self, probe: Probe, largest: float, scale: float, at_floor: bool) -> bool:
        """A gradient that may fit once the scale is lower: not a culprit yet (a forward
        value is one whatever the scale; a gradient at the floor, or beyond even unscaled)."""
        unscaled_beyond = bool(np.isfinite(largest)) and largest / scale > self.limits.max_finite
        return probe.role != FORWARD and not at_floor and not unscaled_beyond

    def _loop_culprit(self, probe: Probe, largest: float, scale: float, at_floor: bool,
                      into: Optional[str] = None) -> Optional[Culprit]:
        """A value leaving a while loop (its Exit) out of range: it started inside the loop,
        whose tensors cannot be probed, so the loop's converted nodes are presumed to blame
        (a -1e9 attention mask in half inside a decoder loop) -- not the Exit, nor the
        Switch and Merge that carry the value out.  ``into``: the float32 node the value was
        seen in, when the Exit itself is not probed.  None for a loop with no converted node."""
        frame, members = self._loops[probe.node]
        half = [n for n in members if n in self._converted]
        if not half:
            return None  # float32 all the way: no half tensor's doing
        if self._scale_may_fit(probe, largest, scale, at_floor):
            return None
        some = _names([self._half_node(n) for n in half[:3]]) + (", ..." if len(half) > 3 else "")
        held_by = ("the %d converted node(s) of while loop %r (%s), whose values cannot be probed "
                   "inside it, as %r leaves it" % (len(half), frame, some, probe.node))
        if into is not None:
            held_by += " into float32 %r, which holds inf/nan" % into
        probe = Probe(tensor=probe.tensor, node=probe.node, op=probe.op, category=probe.category,
                      role=probe.role, half_nodes=[self._half_node(n) for n in half])
        return self._culprit(probe, largest, held_by, presumed=True)

    def _leaving(self, loop_exit: str, seen_in: Probe) -> Probe:
        """A probe standing for the unprobed ``loop_exit``: a gradient in a backward pass
        (the loss scale's rule applies), else what ``seen_in`` is."""
        if not in_backward_scope(loop_exit):
            role = seen_in.role
        else:  # TensorFlow sums a loop-invariant input's gradient (a weight's) in "Enter_grad/b_acc"
            role = WEIGHT_GRADIENT if "Enter_grad/" in loop_exit else ACTIVATION_GRADIENT
        return Probe(tensor=loop_exit + ":0", node=loop_exit, op="Exit", category=None, role=role)

    def _with_half_readers(self, probe: Probe) -> Probe:
        """``probe`` with the converted nodes added that would read its value in half once
        its half nodes are float32 (half_readers.py)."""
        kept = half_readers(probe.node, [n.name for n in probe.half_nodes], self._decisions,
                            lambda node: self._readers.get(node, ()))
        if len(kept) == len(probe.half_nodes):
            return probe
        half_nodes = [self._half_node(n) for n in kept]
        return Probe(tensor=probe.tensor, node=probe.node, op=probe.op, category=probe.category,
                     role=probe.role, half_nodes=half_nodes)

    def _half_frontier(self, node: str, inputs: Optional[List[str]] = None) -> List[HalfNode]:
        """The converted nodes nearest ``node`` up its float32 inputs, or up ``inputs`` of
        them (breadth first)."""
        for entered in self._walk_up(node, lambda tensor, source: True, inputs):
            found = [n for n in entered if n in self._converted]
            if found:
                return [self._half_node(n) for n in found]
        return []

    def _loop_upstream(self, node: str, measured: Dict[str, bool]) -> Optional[str]:
        """The Exit of a while loop with converted nodes that ``node`` reads within
        FRONTIER_DEPTH float32 nodes no probe measured (the loop's value, unseen on its way),
        or None."""
        def unmeasured_float32(tensor, source):
            return tensor not in measured and source not in self._converted

        for entered in self._walk_up(node, unmeasured_float32):
            for source in entered:
                if source in self._loops and any(n in self._converted for n in self._loops[source][1]):
                    return source
        return None

    def _walk_up(self, node: str, through: Callable[[str, str], bool],
                 inputs: Optional[List[str]] = None):
        """The nodes up ``node``'s inputs (or up ``inputs`` of them), level by level
        (breadth first, FRONTIER_DEPTH levels): each level's nodes not met before that
        ``through(tensor, source)`` lets the walk enter from the tensor it read."""
        level, seen = [node], {node}
        for _ in range(FRONTIER_DEPTH):
            entered = []
            for name in level:
                read = inputs if inputs is not None and name == node else self._inputs.get(name, ())
                for tensor in read:
                    source = tensor.split(":")[0]
                    if source not in seen and through(tensor, source):
                        seen.add(source)
                        entered.append(source)
            yield entered
            level = entered

    def _half_node(self, node: str) -> HalfNode:
        return HalfNode(node, self._decisions[node].op, self._decisions[node].category)

    @staticmethod
    def _culprit(probe: Probe, largest: float, held_by: str, presumed: bool = False) -> Culprit:
        return Culprit(tensor=probe.tensor, node=probe.node, op=probe.op, role=probe.role,
                       max_abs=largest if np.isfinite(largest) else float("inf"),
                       half_nodes=[n.name for n in probe.half_nodes], held_by=held_by,
                       fix=fix_for(probe.half_nodes), presumed=presumed)


# Half readers taking parts of a float32 tensor: a raw income column read by a float32 log,
# the other columns sliced into a dense layer, is no culprit of the slices'
_SLICES = frozenset({"StridedSlice", "Slice", "Split", "SplitV", "Unpack", "Gather", "GatherV2", "GatherNd"})


def _names(half_nodes) -> str:
    return ", ".join("%r (%s, %s)" % (n.name, n.op, "%s list" % n.category if n.category else "no list")
                     for n in half_nodes)


def _renamed(probe: Probe, tensor: str) -> Probe:
    return Probe(tensor=tensor, node=probe.node, op=probe.op, category=probe.category,
                 role=probe.role, half_nodes=probe.half_nodes)
