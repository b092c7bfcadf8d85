"""The allow / infer / deny / clear op lists, as data, and every way of editing them.

Lists (mirroring TensorFlow's ``auto_mixed_precision_lists.h``):

* allow: performance-critical ops that are always converted (MatMul, Conv2D, ...);
* infer: numerically safe ops converted when they sit between allow ops;
* deny: numerically dangerous ops that stay float32, and keep what follows float32;
* clear: ops with no numerical effect that take the colour of their neighbours.

``effective_lists(dtype, compat, lists)`` is the one place where the built-in lists,
the environment variables ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_<L>_{ADD,REMOVE}``
(``<L>`` = ALLOWLIST / INFERLIST / DENYLIST / CLEARLIST, or TF 1.15's WHITELIST /
GRAYLIST / BLACKLIST), the optimisation level and Python overrides are combined.
``env_warnings`` names what in those variables is probably a typo, since TensorFlow
accepts a misspelled variable or op type without a word.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Callable, FrozenSet, Iterable, List, Mapping, Optional, Union

from .compat import COMPATS

CATEGORIES = ("allow", "infer", "deny", "clear")

_ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
# Newest names first; TF 1.15 / NVIDIA names as aliases.
_ENV_NAMES = {
    "allow": ("WHITELIST", "ALLOWLIST"),
    "infer": ("GRAYLIST", "INFERLIST"),
    "deny": ("BLACKLIST", "DENYLIST"),
    "clear": ("CLEARLIST",),
}
LEVEL_ENV = _ENV_PREFIX + "LEVEL"
# What else TensorFlow's pass reads under the prefix: not typos.
_OTHER_PASS_VARIABLES = ("EMULATE_FP16", "LOG_PATH", "SIMULATE_GPU")
LEVELS = ("", "UNSAFE_FORCE_ALL", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY")


@dataclass(frozen=True)
class OpLists:
    """Four disjoint sets of op type names."""

    allow: FrozenSet[str]
    infer: FrozenSet[str]
    deny: FrozenSet[str]
    clear: FrozenSet[str]

    def category(self, op_type: str) -> Optional[str]:
        """``"allow"``, ``"infer"``, ``"deny"``, ``"clear"``, or None for unlisted ops."""
        for name in CATEGORIES:
            if op_type in getattr(self, name):
                return name
        return None

    def edited(self, add: Mapping[str, Iterable[str]] = None,
               remove: Mapping[str, Iterable[str]] = None) -> "OpLists":
        """A copy with ops added to, then removed from, the named lists."""
        sets = {name: set(getattr(self, name)) for name in CATEGORIES}
        for name, ops in (add or {}).items():
            sets[_check_category(name)].update(ops)
        for name, ops in (remove or {}).items():
            sets[_check_category(name)].difference_update(ops)
        return OpLists(**{name: frozenset(ops) for name, ops in sets.items()})

    def validate(self) -> "OpLists":
        """Raises ValueError if an op is in two lists (TensorFlow fails silently there)."""
        seen = {}
        for name in CATEGORIES:
            for op in sorted(getattr(self, name)):
                if op in seen:
                    raise ValueError(
                        "op lists conflict: %r is in both the %s and the %s list; remove it "
                        "from one (lists=... or %s<LIST>_REMOVE)" % (op, seen[op], name, _ENV_PREFIX))
                seen[op] = name
        return self

    def to_dict(self):
        return {name: sorted(getattr(self, name)) for name in CATEGORIES}


def _check_category(name: str) -> str:
    if name not in CATEGORIES:
        raise ValueError("unknown op list %r; expected one of %s" % (name, ", ".join(CATEGORIES)))
    return name


def _ops(text: str) -> FrozenSet[str]:
    return frozenset(text.split())


# --- float16, TensorFlow 2.15 (CUDA lists with every version gate open, dumped from its
# paintbuckets file; TF 2.21 differs only by adding VoxelMax to allow) --------------------
_TF215_FP16_ALLOW = _ops("""
    BatchMatMul BatchMatMulV2 BlockLSTM BlockLSTMGrad BlockLSTMGradV2 BlockLSTMV2 Conv2D
    Conv2DBackpropFilter Conv2DBackpropInput Conv3D Conv3DBackpropFilter
    Conv3DBackpropFilterV2 Conv3DBackpropInput Conv3DBackpropInputV2 CudnnRNN
    CudnnRNNBackprop CudnnRNNBackpropV2 CudnnRNNBackpropV3 CudnnRNNV2 CudnnRNNV3
    DepthwiseConv2dNative DepthwiseConv2dNativeBackpropFilter
    DepthwiseConv2dNativeBackpropInput Einsum FastUnsortedSegmentMax
    FusedConv2DBiasActivation FusedSparseConvGpuV2 GRUBlockCell GRUBlockCellGrad
    LSTMBlockCell LSTMBlockCellGrad MatMul Mha MhaV2 Pmlp Tmlp TmlpV2 TmlpV3
""")
_FP16_ALLOW = _TF215_FP16_ALLOW | _ops("VoxelMax")
_FP16_INFER = _ops("""
    Add AddN AddV2 AvgPool AvgPool3D AvgPool3DGrad AvgPoolGrad BiasAdd BiasAddGrad BiasAddV1
    Elu EluGrad Erf Erfc FloorDiv FusedBatchNormGradV2 FusedBatchNormGradV3
    FusedBatchNormV2 FusedBatchNormV3 Inv LeakyRelu LeakyReluGrad Log Log1p LogSoftmax Mul
    Prod RealDiv Reciprocal Selu SeluGrad Sigmoid SigmoidGrad Softmax Softplus SoftplusGrad
    Softsign SoftsignGrad Sqrt Sub Tanh TanhGrad _FusedBatchNormEx
""")
_FP16_DENY = _ops("""
    Exp Expm1 L2Loss Mean Pow SaveV2 SoftmaxCrossEntropyWithLogits
    SparseSoftmaxCrossEntropyWithLogits Sum
""")
_FP16_CLEAR = _ops("""
    Abs ArgMax ArgMin BatchToSpace BatchToSpaceND BroadcastTo Ceil CheckNumerics ClipByValue
    Concat ConcatV2 DepthToSpace DynamicPartition DynamicStitch EnsureShape Enter Equal Exit
    ExpandDims Fill Floor Gather GatherNd GatherV2 Greater GreaterEqual Identity IdentityN
    IsFinite IsInf IsNan Less LessEqual Max MaxPool MaxPool3D MaxPool3DGrad MaxPool3DGradGrad
    MaxPoolGrad MaxPoolGradGrad MaxPoolGradGradV2 MaxPoolGradV2 MaxPoolV2 Maximum Merge Min
    Minimum MirrorPad MirrorPadGrad Neg NextIteration NotEqual OneHot OnesLike Pack Pad PadV2
    PreventGradient Rank Relu Relu6 Relu6Grad ReluGrad Reshape ResizeNearestNeighbor
    ResizeNearestNeighborGrad Reverse ReverseSequence ReverseV2 Round Select SelectV2 Shape
    ShapeN Sign Size Slice Snapshot SpaceToBatch SpaceToBatchND SpaceToDepth Split SplitV
    Squeeze StopGradient StridedSlice StridedSliceGrad Switch TensorListConcat
    TensorListConcatLists TensorListConcatV2 TensorListFromTensor TensorListGather
    TensorListGetItem TensorListPopBack TensorListPushBack TensorListPushBackBatch
    TensorListScatter TensorListScatterIntoExistingList TensorListScatterV2 TensorListSetItem
    TensorListSplit TensorListStack Tile TopK TopKV2 Transpose Unpack Where ZerosLike
""")

# --- float16, TensorFlow 1.15 (white / gray / black / clear) ----------------------------
# BatchMatMul(V2) are white because every CUDA NVIDIA ships TF 1.15 with is >= 9.1.
_TF115_ALLOW = _ops("""
    BatchMatMul BatchMatMulV2 BlockLSTM BlockLSTMGrad Conv2D Conv2DBackpropFilter
    Conv2DBackpropInput CudnnRNN CudnnRNNBackprop CudnnRNNBackpropV2 CudnnRNNBackpropV3
    CudnnRNNV2 CudnnRNNV3 GRUBlockCell GRUBlockCellGrad LSTMBlockCell LSTMBlockCellGrad MatMul
""")
_TF115_INFER = _FP16_INFER - _ops("""
    Log Log1p LogSoftmax Softmax Selu SeluGrad Softsign SoftsignGrad
""")
_TF115_DENY = _FP16_DENY | _ops("Log Log1p LogSoftmax Softmax")
_TF115_CLEAR = (_FP16_CLEAR - _ops("""
    SelectV2 Unpack TensorListConcat TensorListConcatLists TensorListConcatV2
    TensorListFromTensor TensorListGather TensorListGetItem TensorListPopBack
    TensorListPushBack TensorListPushBackBatch TensorListScatter
    TensorListScatterIntoExistingList TensorListScatterV2 TensorListSetItem TensorListSplit
    TensorListStack
""")) | _ops("""
    StackPopV2 StackPushV2 TensorArrayConcatV3 TensorArrayGatherV3 TensorArrayReadV3
    TensorArrayScatterV3 TensorArraySplitV3 TensorArrayWriteV3
""")

# --- bfloat16 (oneDNN lists) -------------------------------------------------------------
_BF16_ALLOW = _ops("""
    BatchMatMul BatchMatMulV2 Conv2D Conv2DBackpropFilter Conv2DBackpropInput Conv3D
    Conv3DBackpropFilterV2 Conv3DBackpropInputV2 DepthwiseConv2dNative
    DepthwiseConv2dNativeBackpropFilter DepthwiseConv2dNativeBackpropInput Einsum
    FusedPadConv2D MatMul
""")
_BF16_DENY = _ops("""
    Exp Expm1 L2Loss Pow SaveV2 SoftmaxCrossEntropyWithLogits
    SparseSoftmaxCrossEntropyWithLogits
""")
_BF16_INFER = _FP16_INFER | _ops("Mean Sum Rsqrt Square SquaredDifference")
_BF16_CLEAR = (_FP16_CLEAR - _ops("MaxPool3DGradGrad OneHot Size")) | _ops(
    "ResizeBilinear ScatterNd StatelessWhile While")
# TF 2.15's bf16 lists: Mean is deny; a missing comma in its source fused "Sum" "Tanh"
# into one bogus entry, so neither is listed; Erfc, Inv and IdentityN are absent.
_TF215_BF16_DENY = _BF16_DENY | _ops("Mean")
_TF215_BF16_INFER = _BF16_INFER - _ops("Mean Sum Tanh Erfc Inv")
_TF215_BF16_CLEAR = _BF16_CLEAR - _ops("IdentityN StatelessWhile While")

_BUILTIN = {
    ("float16", "latest"): (_FP16_ALLOW, _FP16_INFER, _FP16_DENY, _FP16_CLEAR),
    ("float16", "tf2.15"): (_TF215_FP16_ALLOW, _FP16_INFER, _FP16_DENY, _FP16_CLEAR),
    ("float16", "tf1.15"): (_TF115_ALLOW, _TF115_INFER, _TF115_DENY, _TF115_CLEAR),
    ("bfloat16", "latest"): (_BF16_ALLOW, _BF16_INFER, _BF16_DENY, _BF16_CLEAR),
    ("bfloat16", "tf2.15"): (_BF16_ALLOW, _TF215_BF16_INFER, _TF215_BF16_DENY, _TF215_BF16_CLEAR),
}


def builtin_lists(dtype: str = "float16", compat: str = "latest") -> OpLists:
    """The lists TensorFlow ships for ``dtype`` in the ``compat`` version, unedited."""
    if compat not in COMPATS:
        raise ValueError("compat=%r is not supported; use one of %s" % (compat, ", ".join(COMPATS)))
    key = (dtype, compat)
    if key not in _BUILTIN:
        raise ValueError(
            "dtype %s has no op lists for compat %s (TensorFlow 1.15 only converts to float16); "
            "use dtype float16, or compat latest" % (dtype, compat))
    return OpLists(*_BUILTIN[key])


def env_list_edits(environ: Mapping[str, str] = None):
    """``(add, remove)`` mappings read from the list environment variables."""
    environ = os.environ if environ is None else environ
    add, remove = {}, {}
    for category, names in _ENV_NAMES.items():
        for name in names:
            add.setdefault(category, []).extend(_split(environ.get(_ENV_PREFIX + name + "_ADD", "")))
            remove.setdefault(category, []).extend(
                _split(environ.get(_ENV_PREFIX + name + "_REMOVE", "")))
    return add, remove


def _list_variables() -> List[str]:
    return [_ENV_PREFIX + name + suffix for names in _ENV_NAMES.values() for name in names
            for suffix in ("_ADD", "_REMOVE")]


def env_warnings(is_op_type: Callable[[str], bool], op_types: Callable[[], Iterable[str]],
                 environ: Mapping[str, str] = None) -> List[str]:
    """One line per probable typo in the pass's environment variables, else ``[]``.

    A typo is a variable under ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_`` that neither this
    pass nor TensorFlow's reads, or a listed op type that ``is_op_type`` denies (is it
    registered now, or in the graph?) and no built-in list names: either edits nothing.
    ``op_types()`` lists the registered op types to suggest from; it is only called when
    one is needed.
    """
    environ = os.environ if environ is None else environ
    known_variables = _list_variables() + [LEVEL_ENV] + [_ENV_PREFIX + n for n in _OTHER_PASS_VARIABLES]
    warnings = []
    for variable in sorted(v for v in environ if v.startswith(_ENV_PREFIX) and v not in known_variables):
        close = difflib.get_close_matches(variable, known_variables, n=1)
        warnings.append("%s is not a variable the mixed-precision pass reads%s; it is ignored" % (
            variable, " (did you mean %s?)" % close[0] if close else ""))
    listed = {op for ops in _BUILTIN.values() for category in ops for op in category}
    for variable in _list_variables():
        for op in _split(environ.get(variable, "")):
            if op in listed or is_op_type(op):
                continue
            close = close_op_types(op, set(op_types()) | set(listed))
            hint = " (did you mean %s?)" % " or ".join(close) if close else ""
            warnings.append("%s names %s, which is neither an op type TensorFlow registers nor "
                            "one in the graph%s; it edits nothing" % (variable, op, hint))
    return warnings


def close_op_types(op: str, op_types: Iterable[str]) -> List[str]:
    """The op types ``op`` may have meant: the same but for case, else up to two close spellings."""
    op_types = sorted(op_types)
    same_but_case = [name for name in op_types if name.lower() == op.lower()]
    return same_but_case or difflib.get_close_matches(op, op_types, n=2, cutoff=0.7)


def _split(text: str):
    return [op.strip() for op in text.split(",") if op.strip()]


ListsOverride = Union[OpLists, Mapping[str, Iterable[str]], None]


def apply_override(base: OpLists, lists: ListsOverride) -> OpLists:
    """Applies ``lists=``: an ``OpLists`` replaces everything; a mapping edits.

    Mapping keys are a category (``"deny": [...]`` replaces that list) or
    ``<category>_add`` / ``<category>_remove``.
    """
    if lists is None:
        return base
    if isinstance(lists, OpLists):
        return lists
    if isinstance(lists, str) or not hasattr(lists, "items"):
        raise ValueError("lists= takes an OpLists or a mapping such as "
                         "{'deny_add': ['Tanh']}; got %r" % (lists,))
    replace, add, remove = {}, {}, {}
    for key, ops in lists.items():
        if isinstance(ops, str):
            raise ValueError("lists[%r] must be a list of op names, not the string %r" % (key, ops))
        category, _, action = key.partition("_")
        _check_category(category)
        target = {"": replace, "add": add, "remove": remove}.get(action)
        if target is None:
            raise ValueError("lists key %r: expected '<list>', '<list>_add' or '<list>_remove' "
                             "with <list> one of %s" % (key, ", ".join(CATEGORIES)))
        target[category] = list(ops)
    sets = {name: frozenset(replace.get(name, getattr(base, name))) for name in CATEGORIES}
    return OpLists(**sets).edited(add, remove)


def apply_level(lists: OpLists, level: str, dtype: str = "float16") -> OpLists:
    """TensorFlow's ``..._GRAPH_REWRITE_LEVEL`` list transforms.

    TENSOR_CORES_ONLY keeps only the allow list of the float16 (CUDA) lists; TensorFlow's
    oneDNN bfloat16 lists never read it (``AutoMixedPrecisionListsMkl`` has no
    ``IsPseudoFastMath`` check), so bfloat16 keeps all four.  TREAT_INFER_AS_DENY moves
    infer ops to deny in every mode.  (UNSAFE_FORCE_ALL is a painting rule, handled by
    the painter.)
    """
    if level == "TENSOR_CORES_ONLY" and dtype == "float16":
        return OpLists(lists.allow, frozenset(), frozenset(), frozenset())
    if level == "TREAT_INFER_AS_DENY":
        return OpLists(lists.allow, frozenset(), lists.deny | lists.infer, lists.clear)
    return lists


def read_level(environ: Mapping[str, str] = None) -> str:
    environ = os.environ if environ is None else environ
    level = environ.get(LEVEL_ENV, "").strip().upper()
    if level not in LEVELS:
        raise ValueError("%s=%r is not a level; use one of %s" % (
            LEVEL_ENV, level, ", ".join(name for name in LEVELS if name)))
    return level


def effective_lists(dtype: str = "float16", compat: str = "latest",
                    lists: ListsOverride = None, environ: Mapping[str, str] = None) -> OpLists:
    """Built-in lists, then environment edits, then the level, then ``lists=``; validated."""
    result = builtin_lists(dtype, compat)
    if not isinstance(lists, OpLists):
        add, remove = env_list_edits(environ)
        result = apply_level(result.edited(add, remove), read_level(environ), dtype)
    return apply_override(result, lists).validate()
