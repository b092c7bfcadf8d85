"""Which nodes the pass may change, and which of their type attributes can become half.

A node is *eligible* (Grappler's ``ShouldProcess``) when it is not preserved (fetch,
feed, ...), not excluded by ``_AutoMixedPrecisionScopeInclude=false`` (NVIDIA's
``auto_mixed_precision_scope``), not already an emulated half node (emulation.py marks
them), and sits on a device the target converts:

* ``target="gpu"``: unplaced nodes (they land on the GPU) and nodes placed on a GPU;
* ``target="cpu"``: unplaced, CPU and GPU nodes (on a machine without a GPU, soft
  placement runs GPU-placed nodes on the CPU).  TensorFlow's ``auto_mixed_precision_cpu``
  skips GPU-placed nodes; graphs without explicit GPU placement are rewritten alike.

A vertex *supports half* (``SupportsF16``) when its op's OpDef allows the target dtype for
that attribute and, where this TensorFlow build has kernels for the device the node will
run on, a kernel is registered for the node with that attribute set to half.
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Tuple

from ..tf_compat import KernelIndex
from .graph_view import GraphView

TARGETS = ("gpu", "cpu")
EXCLUDED_BY_NAME = "excluded by name"  # the reason of a node nodes_to_exclude names
SCOPE_EXCLUDE_ATTR = "_AutoMixedPrecisionScopeInclude"
# Marks a node emulation.py runs as float32 for a half one: a later rewrite leaves it be.
EMULATED_ATTR = "_AutoMixedPrecisionEmulated"
# One part of a device string naming a device: "device:GPU:0", "device:CPU:*", legacy "gpu:0".
_DEVICE_PART = re.compile(r"^(?:device:)?([A-Za-z_]+):(?:\d+|\*)$")
_TASK_PARTS = ("job", "replica", "task")  # where a node runs, not on which kind of device


def device_type(device: str) -> str:
    """Upper-case device type of a device string, or ``""`` when it names none -- an
    unplaced node, or one pinned to a task only, as ``replica_device_setter`` pins them.

    >>> device_type("/job:w/replica:0/task:0/device:GPU:0"), device_type("/cpu:0")
    ('GPU', 'CPU')
    >>> device_type("/job:worker/task:1"), device_type("/job:ps/replica:0")
    ('', '')
    """
    for part in reversed(device.split("/")):
        match = _DEVICE_PART.match(part)
        if match and match.group(1).lower() not in _TASK_PARTS:
            return match.group(1).upper()
    return ""


def node_eligibility(nodes, target: str, preserved: Mapping[str, str]
                     ) -> Tuple[List[bool], List[Optional[str]]]:
    """``(eligible, reason)`` per NodeDef; ``reason`` says why a node is not eligible."""
    eligible: List[bool] = []
    reasons: List[Optional[str]] = []
    by_device: Dict[str, Optional[str]] = {}
    for node in nodes:
        reason = preserved.get(node.name)
        if reason is None:
            attr = node.attr
            if SCOPE_EXCLUDE_ATTR in attr and not attr[SCOPE_EXCLUDE_ATTR].b:
                reason = "excluded by auto_mixed_precision_scope"
            elif EMULATED_ATTR in attr:
                reason = "already emulated half: a float32 kernel on values rounded to half"
            else:
                device = node.device
                if device not in by_device:
                    by_device[device] = _device_reason(device, target)
                reason = by_device[device]
        eligible.append(reason is None)
        reasons.append(reason)
    return eligible, reasons


def _device_reason(device: str, target: str) -> Optional[str]:
    kind = device_type(device)
    if not kind or "GPU" in kind:
        return None
    if target == "cpu" and "CPU" in kind:
        return None
    return "placed on %s; target=%r converts %s" % (
        device, target, "GPU nodes only" if target == "gpu" else "CPU and GPU nodes only")


class HalfSupport:
    """``supports(vertex)`` / ``opdef_allows(vertex)`` for one view, dtype and target."""

    def __init__(self, view: GraphView, target_dtype: int, target: str,
                 kernels: Optional[KernelIndex] = None):
        self.view = view
        self.target_dtype = target_dtype
        self.kernels = kernels if kernels is not None else KernelIndex()
        self.kernel_device = "CPU" if target == "cpu" else "GPU"
        self.check_kernels = (KernelIndex.available()
                              and self.kernels.device_has_kernels(self.kernel_device))
        self._allowed: Dict[Tuple[str, str], bool] = {}
        self._kernel_cache: Dict[tuple, bool] = {}

    def opdef_allows(self, vertex: int) -> bool:
        """The OpDef lets this type attribute be the target dtype (``SupportsF16DataType``)."""
        view = self.view
        name, _ = view.vertex_attr[vertex]
        node = view.vertex_node[vertex]
        op_def = view.op_defs[node]
        # Grappler checks half support against the global op registry, never a function.
        if not name or op_def is None or view.ops[node] in view.function_ops:
            return False
        key = (view.ops[node], name)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = False
            for attr_def in op_def.attr:
                if attr_def.name == name:
                    types = attr_def.allowed_values.list.type
                    allowed = not types or self.target_dtype in types
                    break
            self._allowed[key] = allowed
        return allowed

    def supports(self, vertex: int) -> bool:
        """OpDef allows half and, when checkable, a half kernel exists (``SupportsF16``)."""
        if not self.opdef_allows(vertex):
            return False
        if not self.check_kernels:
            return True
        return self.has_half_kernel(vertex)

    def has_half_kernel(self, vertex: int) -> bool:
        view = self.view
        node_index = view.vertex_node[vertex]
        node = view.nodes[node_index]
        op = view.ops[node_index]
        name, list_index = view.vertex_attr[vertex]
        constrained = self.kernels.constraint_attrs(op)
        values = {c: _attr_value(node.attr, c, view.op_defs[node_index]) for c in constrained}
        label = node.attr["_kernel"].s.decode() if "_kernel" in node.attr else ""
        key = (op, name, list_index, label, tuple(values[c] for c in constrained))
        cached = self._kernel_cache.get(key)
        if cached is None:
            if name in values:
                current = values[name]
                if list_index < 0:
                    values[name] = self.target_dtype
                elif isinstance(current, tuple) and list_index < len(current):
                    values[name] = current[:list_index] + (self.target_dtype,) + current[list_index + 1:]
            cached = self.kernels.has_kernel(op, self.kernel_device, values, label)
            self._kernel_cache[key] = cached
        return cached


def _attr_value(attr, name: str, op_def):
    if name in attr:
        value = attr[name]
        if value.WhichOneof("value") == "list":
            return tuple(value.list.type)
        return value.type
    for attr_def in op_def.attr if op_def is not None else ():
        if attr_def.name == name and attr_def.HasField("default_value"):
            return attr_def.default_value.type
    return None
