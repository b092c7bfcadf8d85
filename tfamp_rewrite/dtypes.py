"""DataType enum values of TensorFlow's ``types.proto`` used by the rewrite, and their names.

Plain integers keep the hot loops of the pass free of protobuf enum lookups.
"""
from __future__ import annotations

DT_INVALID = 0
DT_FLOAT = 1
DT_DOUBLE = 2
DT_INT32 = 3
DT_QINT8 = 11
DT_QUINT8 = 12
DT_QINT32 = 13
DT_BFLOAT16 = 14
DT_QINT16 = 15
DT_QUINT16 = 16
DT_HALF = 19
DT_RESOURCE = 20
DT_VARIANT = 21

QUANTIZED = frozenset({DT_QINT8, DT_QUINT8, DT_QINT32, DT_QINT16, DT_QUINT16})

# The low-precision targets the rewrite supports, by their Python names.
TARGET_DTYPES = {"float16": DT_HALF, "bfloat16": DT_BFLOAT16}
HALF_DTYPES = frozenset(TARGET_DTYPES.values())

_NAMES = {
    DT_FLOAT: "float32",
    DT_DOUBLE: "float64",
    DT_HALF: "float16",
    DT_BFLOAT16: "bfloat16",
    DT_INT32: "int32",
    DT_RESOURCE: "resource",
    DT_VARIANT: "variant",
}


def dtype_name(dtype: int) -> str:
    """Python-style name of a DataType enum value (``float32``, ``int64``, ...)."""
    name = _NAMES.get(dtype)
    if name is None:
        from tensorflow.core.framework import types_pb2

        try:
            name = types_pb2.DataType.Name(dtype)[3:].lower()
        except ValueError:
            name = "invalid"
        if name.endswith("_ref"):
            name = name[:-4] + " (ref)"
    return name
