"""Tensor Core numerics on any CPU: half nodes run float32 kernels on values rounded to half.

A Tensor Core GPU reads half inputs, multiplies exactly and accumulates in float32, then
stores the result in half; its elementwise half kernels compute in float32 and round
once.  A CPU's half kernels do neither the same way (their results depend on the CPU) and
are 20-100x slower.  ``emulate_half`` turns a mixed-precision graph into one that computes
what the GPU computes, with float32 kernels and Casts only -- bit-reproducibly on any CPU
and at float32 speed.  Every half tensor of the mixed-precision graph gets a float32
*twin* holding exactly its values, and the emulated nodes read twins::

    for each node N to emulate: its half type attributes become float32
    for each data edge P:p -> C:k that carried a half tensor:
        P emulated,     C emulated:  C reads round(P:p)         = Cast(Cast(P:p, half), float32)
        P emulated,     C not:       C reads Cast(P:p, half)     (the first Cast of round)
        P not emulated, C emulated:  C reads Cast(P:p, float32)  (exact: P:p holds half values)
        P not emulated, C not:       unchanged
    round(P:p) is P:p itself after ops that only move or select values (Identity, Reshape,
    Relu, MaxPool, loop plumbing, ...): their outputs hold half values already.

A gather of a float32 value the pass casts to half (an embedding table, ``Gather(Cast(table,
half), ids)``) reads the float32 value and rounds the rows it picks instead: rounding is
elementwise, so the bits are the same, and the whole table is no longer rounded each run.

Emulated nodes carry the attribute ``_AutoMixedPrecisionEmulated`` (TensorFlow ignores
attributes starting with ``_``), so rewriting an emulated graph changes nothing.  Half
outputs of emulated nodes are rounded even where nothing reads them, so a fetch of one
returns what the GPU would (``EmulationReport.rounded_outputs`` names the tensor).
Casts are shared per producer port and named like Grappler's
(``<src>-<port>-EmulateCastToFp16-<k>-AutoMixedPrecision``, ``...EmulateCastToFp32...``).
Cast rounds to nearest even with overflow to inf and keeps half's subnormals: fp16's
65504 limit and its 2^-24 flush happen exactly where they would on the GPU.

The output holds stock ops only, so it runs on any TensorFlow and may be written out.
Code that runs the graph in a process with the op library loaded (sessions, ``tfamp-rewrite
convert --validate``) then turns each rounding pair into one ``RoundToHalf`` node, the same
bits in one pass instead of two Cast kernels (rounding.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Optional, Set, Tuple

from ..dtypes import DT_FLOAT, HALF_DTYPES
from .casts import CAST_SUFFIX, add_cast_node, set_type_attr, unique_cast_name
from .eligibility import EMULATED_ATTR
from .graph_view import GraphView

# Ops whose float outputs are copies or selections of their float inputs (or 0 / 1): fed
# half values, they produce half values, so rounding after them would change nothing.
VALUE_PRESERVING_OPS = frozenset({
    "Identity", "IdentityN", "Snapshot", "StopGradient", "PreventGradient", "CheckNumerics",
    "EnsureShape", "Reshape", "Squeeze", "ExpandDims", "Transpose", "ConjugateTranspose",
    "ConcatV2", "Concat", "Pack", "Unpack", "Split", "SplitV", "Slice", "StridedSlice",
    "Gather", "GatherV2", "GatherNd", "Tile", "BroadcastTo", "Reverse", "ReverseV2",
    "Pad", "PadV2", "MirrorPad", "DepthToSpace", "SpaceToDepth", "Select", "SelectV2",
    "Relu", "Relu6", "ReluGrad", "Relu6Grad", "MaxPool", "MaxPoolV2", "MaxPool3D", "Max",
    "Min", "Neg", "Abs", "ZerosLike", "OnesLike", "Fill", "Enter", "RefEnter", "Exit",
    "RefExit", "Merge", "RefMerge", "Switch", "RefSwitch", "NextIteration",
    "RefNextIteration",
})

# Gathers (their params are input 0): rounding the rows they pick equals picking rounded rows.
GATHER_OPS = frozenset({"Gather", "GatherV2", "GatherNd"})


@dataclass
class EmulationReport:
    """What emulation changed in one graph."""

    nodes: int = 0                   # nodes now running float32 kernels for half ones
    rounding_casts: int = 0          # Cast pairs rounding an emulated output to half
    widening_casts: int = 0          # half -> float32 Casts feeding emulated nodes
    narrowing_casts: int = 0         # float32 -> half Casts feeding nodes that stay half
    gathers_rounding_rows: int = 0   # gathers of a cast table that round the rows they pick
    # RoundToHalf nodes that took over the rounding Cast pairs afterwards, one per rounded
    # tensor, here and in function bodies, where the op library is loaded (rounding.py)
    rounding_ops: int = 0
    # Nodes that computed in half before this rewrite (a graph the command line converted):
    # emulation leaves them be, so they run native half kernels (computing_in_half)
    native_half_nodes: int = 0
    # "node:port" of an emulated half output -> the float32 tensor holding its rounded value
    rounded_outputs: Dict[str, str] = field(default_factory=dict)

    def add(self, other: "EmulationReport") -> None:
        """Adds ``other``'s counts (a function body's) to these."""
        self.nodes += other.nodes
        self.rounding_casts += other.rounding_casts
        self.widening_casts += other.widening_casts
        self.narrowing_casts += other.narrowing_casts
        self.gathers_rounding_rows += other.gathers_rounding_rows
        self.rounding_ops += other.rounding_ops


def emulate_half(graph_def, nodes: Iterable[str], lookup_op_def: Callable[[str], Optional[object]],
                 function_ops: frozenset = frozenset()) -> EmulationReport:
    """Emulates the half precision of ``nodes`` in ``graph_def`` itself (module docstring).

    ``graph_def`` is a mixed-precision graph (a private copy: it is mutated); ``nodes``
    names the nodes whose half type attributes are to run as float32.
    """
    view = GraphView(graph_def, lookup_op_def, function_ops)
    emulated = {view.index[name] for name in nodes if name in view.index}
    report = EmulationReport(nodes=len(emulated))
    half_inputs = {i: _retype_half_attrs(view, i) for i in sorted(emulated)}
    rows_rounded = _gathers_of_cast_tables(view, emulated, half_inputs)
    report.gathers_rounding_rows = len(rows_rounded)
    casts = _TwinCasts(view, report, rows_rounded)
    for i in emulated:
        view.nodes[i].attr[EMULATED_ATTR].b = True
    for i in sorted(emulated):  # round every half output, read or not (fetches see it)
        if view.ops[i] not in VALUE_PRESERVING_OPS or i in rows_rounded:
            for port in _half_output_ports(view, i):
                casts.rounded(i, port)
    for dst, data in enumerate(view.inputs):
        for k, (src, port) in enumerate(data):
            produced = view.vertex_dtype[view.output_vertex(src, port)]
            if produced not in HALF_DTYPES:
                continue
            if k == 0 and dst in rows_rounded:
                view.nodes[dst].input[view.input_slots[dst][k]] = rows_rounded[dst]
                continue
            wants_float = k in half_inputs.get(dst, ())
            if src in emulated and _is_retyped_output(view, src, port):
                tensor = casts.twin(src, port) if wants_float else casts.narrowed(src, port, produced)
            elif wants_float:
                tensor = casts.widened(src, port, produced)
            else:
                continue
            view.nodes[dst].input[view.input_slots[dst][k]] = tensor
    casts.count()
    return report


def computing_in_half(view: GraphView) -> int:
    """How many nodes of ``view`` compute in half already (a graph the command line
    converted): neither a Cast, a Const nor an op that only moves values.  Emulation leaves
    them be, so they run native half kernels."""
    return sum(1 for i, op in enumerate(view.ops)
               if op not in VALUE_PRESERVING_OPS and op not in ("Cast", "Const")
               and any(view.vertex_dtype[v] in HALF_DTYPES for v in view.vertices[i].values()))


def is_emulation_cast(node) -> bool:
    """Whether ``node`` is one of the Casts ``emulate_half`` adds."""
    return node.op == "Cast" and "-EmulateCastTo" in node.name and node.name.endswith(CAST_SUFFIX)


def _gathers_of_cast_tables(view: GraphView, emulated: Set[int],
                            half_inputs: Dict[int, Set[int]]) -> Dict[int, str]:
    """Emulated gathers whose params are a float32 value the pass casts to half (``Cast``,
    rounding to nearest): each -> that float32 tensor, which it reads instead of the
    widened cast (its picked rows are rounded after it)."""
    found = {}
    for dst in emulated:
        if view.ops[dst] not in GATHER_OPS or 0 not in half_inputs.get(dst, ()):
            continue
        src, _ = view.inputs[dst][0]
        cast = view.nodes[src]
        if (src not in emulated and cast.op == "Cast" and not cast.attr["Truncate"].b
                and cast.attr["SrcT"].type == DT_FLOAT and cast.attr["DstT"].type in HALF_DTYPES):
            found[dst] = cast.input[0]
    return found


def _retype_half_attrs(view: GraphView, node: int) -> Set[int]:
    """Sets ``node``'s half type attributes to float32; returns its input ports that were half."""
    changed = set()
    for type_attr, vertex in view.vertices[node].items():
        if type_attr[0] and view.vertex_dtype[vertex] in HALF_DTYPES:
            set_type_attr(view.nodes[node], type_attr, DT_FLOAT)
            changed.add(type_attr)
    return {k for k, attr in enumerate(view.in_attrs[node]) if attr in changed}


def _is_retyped_output(view: GraphView, node: int, port: int) -> bool:
    name, _ = view.output_attr(node, port)
    return bool(name)  # a fixed-type half port stays half


def _half_output_ports(view: GraphView, node: int):
    outs = view.out_attrs[node] or ()
    for port, attr in enumerate(outs):
        if attr[0] and view.vertex_dtype[view.vertices[node][attr]] in HALF_DTYPES:
            yield port


class _TwinCasts:
    """Creates the Casts of one emulation, shared per producer port."""

    def __init__(self, view: GraphView, report: EmulationReport, rows_rounded=frozenset()):
        self.view = view
        self.report = report
        self.rows_rounded = rows_rounded  # value-preserving nodes whose outputs are rounded
        self.taken = set(view.index)
        self._made: Dict[Tuple[int, int, str], str] = {}

    def _tensor(self, node: int, port: int) -> str:
        name = self.view.nodes[node].name
        return name if port == 0 else "%s:%d" % (name, port)

    def _half_dtype(self, node: int, port: int) -> int:
        return self.view.vertex_dtype[self.view.output_vertex(node, port)]

    def rounded(self, node: int, port: int) -> str:
        """The float32 tensor holding emulated ``node:port`` rounded to its half dtype."""
        key = (node, port, "round")
        if key not in self._made:
            half = self.narrowed(node, port, self._half_dtype(node, port))
            self._made[key] = self._cast(node, port, half, self._half_dtype(node, port), DT_FLOAT)
            self.report.rounded_outputs["%s:%d" % (self.view.nodes[node].name, port)] = \
                self._made[key] + ":0"
        return self._made[key]

    def twin(self, node: int, port: int) -> str:
        """What an emulated reader of emulated ``node:port`` reads."""
        if self.view.ops[node] in VALUE_PRESERVING_OPS and node not in self.rows_rounded:
            return self._tensor(node, port)
        return self.rounded(node, port)

    def narrowed(self, node: int, port: int, half: int) -> str:
        """``Cast(node:port, half)``: for an emulated producer, the half value it stands for."""
        key = (node, port, "narrow")
        if key not in self._made:
            self._made[key] = self._cast(node, port, self._tensor(node, port), DT_FLOAT, half)
        return self._made[key]

    def widened(self, node: int, port: int, half: int) -> str:
        """``Cast(node:port, float32)`` of a half producer that is not emulated (exact)."""
        key = (node, port, "widen")
        if key not in self._made:
            self._made[key] = self._cast(node, port, self._tensor(node, port), half, DT_FLOAT)
        return self._made[key]

    def count(self) -> None:
        """Fills the report's Cast counts (a rounding pair's first Cast counts once, there)."""
        kinds = [kind for _, _, kind in self._made]
        self.report.rounding_casts = kinds.count("round")
        self.report.widening_casts = kinds.count("widen")
        self.report.narrowing_casts = kinds.count("narrow") - kinds.count("round")

    def _cast(self, node: int, port: int, input_name: str, src: int, dst: int) -> str:
        source = self.view.nodes[node]
        name = unique_cast_name(source.name, port, dst, self.taken, prefix="Emulate")
        add_cast_node(self.view.graph_def, name, input_name, source.device, src, dst)
        return name
