"""Is an ``AttrValue`` what its ``OpDef.AttrDef`` allows?  The rules TensorFlow's importer applies.

``attr_problem(value, attr_def, in_function) -> None | "why not"`` mirrors TensorFlow's
``ValidateAttrValue`` / ``AttrValueHasType``:

* the value's kind matches the attr's type (``type``, ``list(int)``, ...); a value with
  nothing set is only allowed for lists; ``placeholder`` only in a function body;
* a DataType is a valid, non-reference enum value other than ``DT_INVALID``, and one of the
  attr's allowed types; a string is one of its allowed strings;
* an int, or a list's length, is at least the attr's minimum;
* a shape is a valid partial shape (no size below -1; no dimensions with unknown rank);
* a tensor is one ``Tensor::FromProto`` accepts: valid dtype and shape, ``tensor_content`` of
  exactly elements x element size bytes, and no more typed values than elements.

``dtype_problem`` and ``tensor_problem`` are the checks of one DataType / TensorProto.
"""
from __future__ import annotations

from typing import Optional

from tensorflow.core.framework import types_pb2

from ..dtypes import dtype_name

_FIELD = {"string": "s", "int": "i", "float": "f", "bool": "b", "type": "type", "shape": "shape",
          "tensor": "tensor", "func": "func"}
_KIND_OF_FIELD = {field: kind for kind, field in _FIELD.items()}
_VALID_DTYPES = frozenset(types_pb2.DataType.values()) - {types_pb2.DT_INVALID}
_REF_OFFSET = 100
_MAX_ELEMENTS = 2 ** 62
_MAX_RANK = 254
# DataType -> bytes per element in tensor_content (types without a fixed size are absent)
_ELEMENT_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 8: 8, 9: 8, 10: 1, 11: 1, 12: 1, 13: 4, 14: 2, 15: 2,
                  16: 2, 17: 2, 18: 16, 19: 2, 22: 4, 23: 8}
# DataType -> (TensorProto field of its typed values, values per element)
_VALUE_FIELD = {1: ("float_val", 1), 2: ("double_val", 1), 7: ("string_val", 1), 8: ("scomplex_val", 2),
                9: ("int64_val", 1), 10: ("bool_val", 1), 14: ("half_val", 1), 18: ("dcomplex_val", 2),
                19: ("half_val", 1), 20: ("resource_handle_val", 1), 21: ("variant_val", 1),
                22: ("uint32_val", 1), 23: ("uint64_val", 1)}
_VALUE_FIELD.update({dtype: ("int_val", 1) for dtype in (3, 4, 5, 6, 11, 12, 13, 15, 16, 17)})


def attr_problem(value, attr_def, in_function: bool = False) -> Optional[str]:
    """Why ``value`` (an AttrValue) does not fit ``attr_def`` (an OpDef.AttrDef), or None."""
    kind = value.WhichOneof("value")
    expected = attr_def.type
    if kind == "placeholder":
        if in_function:
            return None
        return "is a function placeholder ('$%s') outside a function" % value.placeholder
    if expected.startswith("list(") and expected.endswith(")"):
        return _list_problem(value, kind, expected[5:-1], attr_def)
    field = _FIELD.get(expected)
    if field is None:  # an attr type this check does not know: TensorFlow's problem, not ours
        return None
    if kind is None:
        return "has no value (%s expected)" % expected
    if kind != field:
        return "holds %s where %s is expected" % (_kind_name(value, kind), expected)
    return _item_problem(getattr(value, field), expected, attr_def)


def _kind_name(value, kind: str) -> str:
    if kind != "list":
        return _KIND_OF_FIELD.get(kind, kind)
    fields = [field for field in _FIELD.values() if len(getattr(value.list, field))]
    return "list(%s)" % _KIND_OF_FIELD[fields[0]] if fields else "list"


def _list_problem(value, kind: Optional[str], inner: str, attr_def) -> Optional[str]:
    field = _FIELD.get(inner)
    if field is None:
        return None
    if kind is None:  # an empty list
        items = ()
    elif kind != "list":
        return "holds %s where list(%s) is expected" % (_kind_name(value, kind), inner)
    else:
        others = [other for other in _FIELD.values() if other != field and len(getattr(value.list, other))]
        if others:
            return "holds list(%s) where list(%s) is expected" % (_KIND_OF_FIELD[others[0]], inner)
        items = getattr(value.list, field)
    if attr_def.has_minimum and len(items) < attr_def.minimum:
        return "has %d item(s); %s needs at least %d" % (len(items), attr_def.name, attr_def.minimum)
    for index, item in enumerate(items):
        problem = _item_problem(item, inner, attr_def, check_minimum=False)
        if problem:
            return "item %d %s" % (index, problem)
    return None


def _item_problem(item, kind: str, attr_def, check_minimum: bool = True) -> Optional[str]:
    if kind == "type":
        problem = dtype_problem(item)
        if problem:
            return problem
        allowed = list(attr_def.allowed_values.list.type)
        if allowed and item not in allowed:
            return "is %s, not one of the allowed %s" % (
                dtype_name(item), ", ".join(dtype_name(dtype) for dtype in allowed))
    elif kind == "string":
        allowed = list(attr_def.allowed_values.list.s)
        if allowed and item not in allowed:
            return "is %r, not one of the allowed %s" % (
                _text(item), ", ".join(repr(_text(text)) for text in allowed))
    elif kind == "int":
        if check_minimum and attr_def.has_minimum and item < attr_def.minimum:
            return "is %d, below its minimum %d" % (item, attr_def.minimum)
    elif kind == "shape":
        return shape_problem(item)
    elif kind == "tensor":
        return tensor_problem(item)
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def dtype_problem(dtype: int, ref_allowed: bool = False) -> Optional[str]:
    """Why ``dtype`` is not a usable DataType (None if it is one)."""
    base = dtype - _REF_OFFSET if ref_allowed and dtype > _REF_OFFSET else dtype
    if dtype == types_pb2.DT_INVALID:
        return "is DT_INVALID (no type)"
    if base not in _VALID_DTYPES:
        return "is %d, not a DataType" % dtype
    if base >= _REF_OFFSET:
        return "is the reference type %s, which attrs may not hold" % dtype_name(dtype)
    return None


def shape_problem(shape) -> Optional[str]:
    """Why a TensorShapeProto is not a valid partial shape (None if it is one)."""
    if shape.unknown_rank and len(shape.dim):
        return "has unknown rank but %d dimension(s)" % len(shape.dim)
    if len(shape.dim) > _MAX_RANK:
        return "has rank %d (at most %d)" % (len(shape.dim), _MAX_RANK)
    for index, dim in enumerate(shape.dim):
        if dim.size < -1:
            return "has dimension %d of size %d" % (index, dim.size)
    return None


def tensor_problem(tensor) -> Optional[str]:
    """Why a TensorProto is not one TensorFlow can build a Tensor from (None if it can)."""
    problem = dtype_problem(tensor.dtype)
    if problem:
        return "has a dtype that %s" % problem
    shape = tensor.tensor_shape
    if shape.unknown_rank or any(dim.size < 0 for dim in shape.dim) or len(shape.dim) > _MAX_RANK:
        return "has shape %s, not a fully known shape" % _shape_text(shape)
    elements = 1
    for dim in shape.dim:
        elements *= dim.size
        if elements > _MAX_ELEMENTS:
            return "has shape %s: too many elements" % _shape_text(shape)
    size = _ELEMENT_BYTES.get(tensor.dtype)
    if tensor.tensor_content:
        if size is not None and len(tensor.tensor_content) != elements * size:
            return "has %d bytes of content, but %s %s needs %d" % (
                len(tensor.tensor_content), dtype_name(tensor.dtype), _shape_text(shape), elements * size)
        return None
    field, per_element = _VALUE_FIELD.get(tensor.dtype, (None, 1))
    if field is not None and len(getattr(tensor, field)) > elements * per_element:
        values = len(getattr(tensor, field)) // per_element
        return "has %d values, but %s %s has %d element(s)" % (
            values, dtype_name(tensor.dtype), _shape_text(shape), elements)
    return None


def _shape_text(shape) -> str:
    if shape.unknown_rank:
        return "<unknown rank>"
    return "[%s]" % ",".join(str(dim.size) for dim in shape.dim)
