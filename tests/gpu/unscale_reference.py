"""Host-side truth for the CUDA kernel: tensors as raw bits, the numpy oracle, test lists.

TensorFlow-free (numpy only): the GPU harness runs where TensorFlow is not installed.

A tensor is a ``HostTensor(kind, bits)``: ``kind`` is ``"float32"``, ``"float16"`` or
``"bfloat16"`` and ``bits`` its storage as uint32 / uint16 (numpy has no bfloat16).

The oracle is the op's contract computed in numpy, with IEEE denormals, as the kernel runs
on a GPU (nvcc without ``-ftz``)::

    out = round_to_kind(float32(x) * float32(inv_scale))   # round to nearest even, inf/nan propagate
    all_finite = no input element is inf or nan

A NaN result must be the one NaN TensorFlow's GPU composite writes (``DEVICE_NAN``: the
GPU's multiply returns the canonical float NaN, then float16 through cvt.rn.f16.f32 and
bfloat16 through Eigen's rounding); everything else must match bit for bit. (The CPU kernel
keeps NaN payloads instead, as TensorFlow's CPU composite does: unscale_element.h.)
"""
from __future__ import annotations

import collections
from typing import List, Sequence, Tuple

import numpy as np

KINDS = ("float32", "float16", "bfloat16")
TYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}  # unscale_element.h: ElementType
BITS_DTYPE = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# Exponent field all ones: inf or nan.
_EXPONENT = {"float32": 0x7F800000, "float16": 0x7C00, "bfloat16": 0x7F80}
_QUIET = {"float32": 0x00400000, "float16": 0x0200, "bfloat16": 0x0040}
_SIGN = {"float32": 0x80000000, "float16": 0x8000, "bfloat16": 0x8000}
# Signalling NaNs: never an output of the kernel (it quiets every NaN it writes), so an
# output element still holding one was never written.
POISON = {"float32": 0x7FA5A5A5, "float16": 0x7D5A, "bfloat16": 0x7F95}
SPECIALS = (np.inf, -np.inf, np.nan)
DEVICE_NAN = {"float32": 0x7FFFFFFF, "float16": 0x7FFF, "bfloat16": 0x7FC0}


class HostTensor(collections.namedtuple("HostTensor", "kind bits")):
    """One gradient on the host: its element kind and its storage bits (1-D)."""

    __slots__ = ()

    @property
    def size(self) -> int:
        return int(self.bits.size)

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.kind]

    @property
    def type_code(self) -> int:
        return TYPE_CODES[self.kind]

    @classmethod
    def from_values(cls, kind: str, values) -> HostTensor:
        """Rounds float values (any float dtype) to ``kind``."""
        return cls(kind, from_float32(kind, np.asarray(values, np.float32).ravel()))

    @classmethod
    def from_array(cls, array: np.ndarray) -> HostTensor:
        """float32 / float16 numpy arrays and bfloat16 ones (ml_dtypes, TensorFlow's)."""
        kind = array.dtype.name
        if kind not in KINDS:
            raise ValueError(f"dtype {array.dtype} is not one of {', '.join(KINDS)}")
        return cls(kind, np.ascontiguousarray(array).ravel().view(BITS_DTYPE[kind]))

    def values(self) -> np.ndarray:
        return to_float32(self.kind, self.bits)


def to_float32(kind: str, bits: np.ndarray) -> np.ndarray:
    """Exact: every float16 and bfloat16 value is a float32 value."""
    if kind == "float32":
        return bits.view(np.float32)
    if kind == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_float32(kind: str, values: np.ndarray) -> np.ndarray:
    """Rounds to nearest even (overflow to inf, NaN stays NaN), as TensorFlow's Cast does."""
    values = np.asarray(values, np.float32)
    if kind == "float32":
        return values.view(np.uint32).copy()
    if kind == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).view(np.uint16)
    wide = values.view(np.uint32).astype(np.uint64)
    rounded = (wide + 0x7FFF + ((wide >> 16) & 1)) >> 16
    quiet_nan = (wide >> 16) | _QUIET["bfloat16"]
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def is_nan(kind: str, bits: np.ndarray) -> np.ndarray:
    magnitude = bits & ~BITS_DTYPE[kind](_SIGN[kind])
    return magnitude > _EXPONENT[kind]


def is_nonfinite(kind: str, bits: np.ndarray) -> np.ndarray:
    return (bits & BITS_DTYPE[kind](_EXPONENT[kind])) == _EXPONENT[kind]


def require_ieee_denormals() -> None:
    """The oracle needs float32 denormals; a process with flush-to-zero set cannot use it."""
    tiny = np.array([2.0**-140], np.float32)
    if not (tiny * np.float32(1.0))[0]:
        raise RuntimeError("this process flushes float32 denormals to zero (FTZ/DAZ), so the "
                           "numpy oracle would disagree with the GPU; run in a fresh process.")


def unscaled(tensor: HostTensor, inv_scale: float) -> np.ndarray:
    """The bits the kernel must write for ``tensor``."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        product = tensor.values() * np.float32(inv_scale)
    return from_float32(tensor.kind, product)


def expected(tensors: Sequence[HostTensor], inv_scale: float) -> Tuple[List[np.ndarray], bool]:
    """(output bits per tensor, all_finite)."""
    require_ieee_denormals()
    outputs = [unscaled(t, inv_scale) for t in tensors]
    all_finite = not any(bool(is_nonfinite(t.kind, t.bits).any()) for t in tensors)
    return outputs, all_finite


def mismatches(kind: str, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Indices where ``got`` is not the oracle's answer ``want`` (NaN: the device's NaN)."""
    wrong = np.where(is_nan(kind, want), got != BITS_DTYPE[kind](DEVICE_NAN[kind]), got != want)
    return np.flatnonzero(wrong)


# --- test lists: the CPU kernel's (tests/support/fused_op_cases.py), without TensorFlow ------

def random_sizes(rng: np.random.Generator, count: int, num_big: int = 0,
                 largest_small: int = 40000, big: Tuple[int, int] = (1_000_000, 4_000_000)):
    """``count`` sizes, log-uniform up to ``largest_small`` (0 included), ``num_big`` big ones."""
    sizes = np.floor(np.exp(rng.uniform(0, np.log(largest_small), count))).astype(np.int64) - 1
    sizes[rng.random(count) < 0.05] = 0
    chosen = rng.choice(count, size=min(num_big, count), replace=False)
    sizes[chosen] = rng.integers(big[0], big[1], size=len(chosen)) | 1
    return [int(s) for s in sizes]


def random_tensors(rng: np.random.Generator, sizes: Sequence[int],
                   kinds: Sequence[str] = KINDS) -> List[HostTensor]:
    """Finite values of mixed kinds and magnitudes (2^-10 .. 2^9 times a normal sample)."""
    tensors = []
    for size in sizes:
        kind = kinds[int(rng.integers(len(kinds)))]
        magnitude = np.float32(2.0 ** int(rng.integers(-10, 10)))
        tensors.append(HostTensor.from_values(
            kind, rng.standard_normal(size, dtype=np.float32) * magnitude))
    return tensors


def with_specials(rng: np.random.Generator, tensors: Sequence[HostTensor]) -> List[HostTensor]:
    """Copies with inf, -inf or nan at the first, the last and a random element of each."""
    poisoned = []
    for tensor in tensors:
        bits = tensor.bits.copy()
        if bits.size:
            for position in (0, bits.size - 1, int(rng.integers(bits.size))):
                special = SPECIALS[int(rng.integers(len(SPECIALS)))]
                bits[position] = from_float32(tensor.kind, np.array([special], np.float32))[0]
        poisoned.append(HostTensor(tensor.kind, bits))
    return poisoned


def every_pattern(kind: str) -> HostTensor:
    """All 65536 encodings of a 16-bit kind: subnormals, ties, infs, nan payloads."""
    if ITEMSIZE[kind] != 2:
        raise ValueError(f"{kind} is not a 16-bit kind")
    return HostTensor(kind, np.arange(2**16, dtype=np.uint16))
