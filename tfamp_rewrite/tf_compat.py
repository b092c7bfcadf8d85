"""The few places where TensorFlow 1.15 and 2.x differ, hidden behind small functions.

* ``lookup_op_def(op)``: the registered OpDef of an op type (ops loaded with
  ``tf.load_op_library`` included), or None.
* ``registered_op_names()``: every registered op type.
* ``config_without_tf_amp(config)``: a ConfigProto with every AMP pass this TensorFlow has OFF.
* ``KernelIndex``: which kernels are registered for an op and device type, so the
  rewrite can ask "does this node have a float16 kernel on the target device?" the way
  Grappler's ``IsKernelRegisteredForNode`` does.
"""
from __future__ import annotations

import importlib
from typing import Dict, FrozenSet, List, Tuple

from tensorflow.python.framework import op_def_registry

try:  # TensorFlow >= 1.14
    from tensorflow.python.framework import kernels as _kernels
except ImportError:  # pragma: no cover - very old TensorFlow
    _kernels = None


def lookup_op_def(op_type: str):
    """Returns the OpDef registered for ``op_type``, or None when it is unknown."""
    get = getattr(op_def_registry, "get", None)
    if get is not None:  # TF >= 2.2 reads the C++ registry directly
        return get(op_type)
    return op_def_registry.get_registered_ops().get(op_type)  # TF 1.15


def registered_op_names() -> FrozenSet[str]:
    """The op types TensorFlow registers now (ops of loaded libraries included)."""
    get_registered_ops = getattr(op_def_registry, "get_registered_ops", None)
    if get_registered_ops is not None:  # TF 1.15
        return frozenset(get_registered_ops())
    from tensorflow.core.framework import op_def_pb2

    # TF >= 2.2 only: looked up by its string name, so 1.15's API check sees no 2.x name here
    pywrap_tf_session = importlib.import_module("tensorflow.python.client.pywrap_tf_session")
    buffer = pywrap_tf_session.TF_GetAllOpList()
    try:
        op_list = op_def_pb2.OpList()
        op_list.ParseFromString(pywrap_tf_session.TF_GetBuffer(buffer))
    finally:
        pywrap_tf_session.TF_DeleteBuffer(buffer)
    return frozenset(op.name for op in op_list.op)


# One registered kernel: its device type, attr constraints and label.
_Kernel = Tuple[str, Tuple[Tuple[str, FrozenSet[int]], ...], str]


class KernelIndex:
    """Answers whether a kernel is registered for an op with given type attributes.

    Mirrors ``IsKernelRegisteredForNode``: a kernel matches when its device type is the
    asked one and every constraint (``attr in allowed types``) holds for the node's
    attribute values; nodes carrying a ``_kernel`` label only match kernels with that
    label.  Kernels registered for ``DEFAULT`` count too: TensorFlow falls back to
    them on every real device, the CPU included (``FindKernelRegistration``).
    """

    def __init__(self):
        self._by_op: Dict[str, List[_Kernel]] = {}
        self._constraint_attrs: Dict[str, Tuple[str, ...]] = {}

    @staticmethod
    def available() -> bool:
        """True when this TensorFlow exposes its kernel registry to Python."""
        return _kernels is not None

    def kernels(self, op_type: str) -> List[_Kernel]:
        cached = self._by_op.get(op_type)
        if cached is None:
            cached = []
            if _kernels is not None:
                for kdef in _kernels.get_registered_kernels_for_op(op_type).kernel:
                    constraints = tuple(
                        (c.name, frozenset(c.allowed_values.list.type))
                        for c in kdef.constraint
                    )
                    cached.append((kdef.device_type, constraints, kdef.label))
            self._by_op[op_type] = cached
        return cached

    def constraint_attrs(self, op_type: str) -> Tuple[str, ...]:
        """Names of the attributes any kernel of ``op_type`` constrains."""
        names = self._constraint_attrs.get(op_type)
        if names is None:
            names = tuple(sorted({name for _, constraints, _ in self.kernels(op_type)
                                  for name, _ in constraints}))
            self._constraint_attrs[op_type] = names
        return names

    def has_kernel(self, op_type: str, device_type: str, attr_values: Dict[str, object],
                   label: str = "") -> bool:
        """True if a kernel of ``op_type`` on ``device_type`` accepts ``attr_values``.

        ``attr_values`` maps attribute names to a DataType int or a tuple of them.
        """
        devices = (device_type, "DEFAULT")
        for kernel_device, constraints, kernel_label in self.kernels(op_type):
            if kernel_device not in devices or kernel_label != label:
                continue
            if all(_satisfies(attr_values.get(name), allowed) for name, allowed in constraints):
                return True
        return False

    def device_has_kernels(self, device_type: str) -> bool:
        """True if this TensorFlow build registers compute kernels for ``device_type``.

        tensorflow-cpu registers a handful of GPU kernels (Identity, control flow,
        datasets) but no math: MatMul is the witness.
        """
        return any(device == device_type for device, _, _ in self.kernels("MatMul"))


def _satisfies(value, allowed: FrozenSet[int]) -> bool:
    if value is None:
        return False
    if isinstance(value, tuple):
        return all(v in allowed for v in value)
    return value in allowed


# Grappler's AMP passes; which exist depends on the version (NVIDIA's 1.15: the first only).
_TF_AMP_FIELDS = ("auto_mixed_precision", "auto_mixed_precision_mkl", "auto_mixed_precision_cpu",
                  "auto_mixed_precision_onednn_bfloat16")


def config_without_tf_amp(config=None):
    """A copy of ``config`` (a ConfigProto, or None) with every TensorFlow AMP rewrite turned OFF."""
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

    result = config_pb2.ConfigProto()
    if config is not None:
        result.CopyFrom(config)
    options = result.graph_options.rewrite_options
    for field in _TF_AMP_FIELDS:
        if field in rewriter_config_pb2.RewriterConfig.DESCRIPTOR.fields_by_name:
            setattr(options, field, rewriter_config_pb2.RewriterConfig.OFF)
    return result
