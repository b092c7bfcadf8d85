"""Unscale gradients and check them for inf/nan in one step.

``unscale_and_check_finite(grads, inv_scale)`` is the contract shared by the loss-scale
optimizer and the fused ``UnscaleAndCheckFinite`` custom op: every gradient comes back
as ``g * inv_scale`` (computed in float32, rounded to the gradient's dtype; inf and nan
propagate), and ``all_finite`` is a scalar bool that is True iff every element of every
*input* gradient is finite.  ``None`` entries pass through as ``None``;
``IndexedSlices`` keep their indices and only their values are unscaled and checked.

Two implementations with identical results:

* the compiled op (``custom_ops/unscale_and_check_finite``): one node per device for the
  whole gradient list, one pass over memory;
* composite stock TensorFlow ops (``Mul``, ``IsFinite``, ``All`` per gradient), used when
  the library cannot be built or loaded, or ``TFAMP_DISABLE_FUSED_OP=1``.

The library is loaded (and built, on first use, if no cached build exists) once per
process; it also holds ``RoundToHalf`` (round_to_half.py).  Which implementation each of
its users gets is logged once.  Its CPU kernel picks its
instruction set at run time (AVX-512, AVX2 + F16C, or a portable loop; ``TFAMP_CPU_ISA``
caps it): ``cpu_kernel_isa()`` says which.
"""
from __future__ import annotations

import ctypes
import logging
import os
from typing import Optional

import tensorflow as tf

from .fusable import OP_TYPE, per_device, unscale_with_stock_ops

_tf = tf.compat.v1
_log = logging.getLogger(__name__)

DISABLE_ENV = "TFAMP_DISABLE_FUSED_OP"
CPU_ISA_ENV = "TFAMP_CPU_ISA"
_GRAD_DTYPES = (tf.float16, tf.float32, tf.bfloat16)


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to something other than 0/false/no."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


class _OpLoader:
    """Loads the compiled op library once, on first use; each of its users logs once which
    implementation it gets."""

    def __init__(self):
        self._resolved = False
        self._module = None
        self.path = None      # the loaded library
        self.failure = None   # why it is not loaded
        self._told = set()    # users that have logged their choice

    def load(self):
        """The library's Python module from ``tf.load_op_library``, or None (see ``failure``)."""
        if not self._resolved:
            self._resolved = True
            self._module, reason = self._load()
            if self._module is None:
                self.failure = reason
            else:
                self.path = reason  # on success, _load's reason is the library's path
        return self._module

    def module(self, user: str = "unscale_and_check_finite", op_type: str = OP_TYPE,
               fallback: str = "composite TF ops"):
        """``load()``, logging the first time ``user`` asks whether it runs ``op_type`` or
        ``fallback``."""
        module = self.load()
        self.tell_once(user, op_type, fallback, None if module is not None else self.failure)
        return module

    def tell_once(self, user: str, op_type: str, fallback: str, unavailable: Optional[str]) -> None:
        """Logs, the first time for ``user``, that it runs ``op_type`` (``unavailable`` None) or
        ``fallback`` because of ``unavailable``."""
        if user in self._told:
            return
        self._told.add(user)
        if unavailable is not None:
            _log.warning("tfamp_rewrite: %s uses %s; the fused %s op is unavailable: %s", user,
                         fallback, op_type, unavailable)
        else:
            _log.info("tfamp_rewrite: %s uses the fused %s op (%s).", user, op_type, self.path)

    @staticmethod
    def _load():
        from . import build  # only needed once, on first use

        if env_flag(DISABLE_ENV):
            return None, f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
        try:
            libraries = build.build_libraries()
        except (build.FusedOpBuildError, OSError) as e:
            return None, f"it could not be built: {e}"
        path = libraries.preferred
        try:
            module = tf.load_op_library(str(path))
        except tf.errors.OpError as e:
            return None, f"{path} does not load: {e.message}"
        try:
            _tf.no_gradient(OP_TYPE)  # loss-scaling machinery, never differentiated
        except KeyError:
            pass  # registered by an earlier loader in this process
        if libraries.gpu is None and tf.test.is_built_with_cuda():
            _log.warning("tfamp_rewrite: the fused %s op has no GPU kernel, so on GPUs it runs "
                         "on the host (%s). See tfamp_rewrite/fused_op/cuda_toolchain.py for how nvcc "
                         "is found.", OP_TYPE, libraries.gpu_error or libraries.gpu_skipped)
        return module, str(path)


_LOADER = _OpLoader()


def loader() -> _OpLoader:
    """The process's loader of the op library (shared by every op in it)."""
    return _LOADER


def fused_op_available() -> bool:
    """True iff the compiled ``UnscaleAndCheckFinite`` op is used (building it if needed)."""
    return _LOADER.module() is not None


def cpu_kernel_isa() -> Optional[str]:
    """The instruction set a CPU kernel of the library's ops (UnscaleAndCheckFinite,
    RoundToHalf) built now runs: ``"avx512"``, ``"avx2"`` or ``"scalar"`` (this CPU's best,
    capped by ``$TFAMP_CPU_ISA``); None without the library.

    Kernels read it when TensorFlow constructs them (per session, or per eager op the
    first time it runs), so a new cap applies to sessions created afterwards.
    """
    if _LOADER.load() is None:
        return None
    query = ctypes.CDLL(_LOADER.path).TfampUnscaleCpuIsa  # the library TensorFlow loaded
    query.restype = ctypes.c_char_p
    return query().decode()


def _dense_values(grad):
    """The tensor whose elements are unscaled and checked for ``grad``."""
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _with_values(grad, values):
    """``grad`` with its dense values replaced by ``values``."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


def _present_gradients(grads):
    """The non-None gradients, after checking there is one and all are half/float/bfloat16."""
    present = [g for g in grads if g is not None]
    if not present:
        raise ValueError(
            "unscale_and_check_finite needs at least one gradient; got only None entries "
            "(check that the loss depends on the trainable variables)."
        )
    for g in present:
        dtype = _dense_values(g).dtype.base_dtype  # a TF1 ref variable's assign gives float32_ref
        if dtype not in _GRAD_DTYPES:
            raise ValueError(
                "unscale_and_check_finite takes float16, float32 or bfloat16 gradients; "
                f"got {dtype.name} for {getattr(g, 'name', g)}."
            )
    return present


def _value_of(gradient):
    """``gradient`` as a tensor of its value: a resource variable's ``assign`` result (a
    variable) read here, outside the group the fused op replaces; a TF1 reference tensor
    (``tf.assign``'s result, float32_ref) dereferenced."""
    tensor = gradient if isinstance(gradient, tf.Tensor) else tf.convert_to_tensor(gradient)
    return tf.identity(tensor) if tensor.dtype != tensor.dtype.base_dtype else tensor


def _scalar_float32(inv_scale):
    """``inv_scale`` as a scalar float32 tensor; a clear error for any other dtype or shape."""
    dtype = getattr(inv_scale, "dtype", None)
    if dtype is not None:
        dtype = tf.as_dtype(dtype).base_dtype
        if not dtype.is_floating or (tf.is_tensor(inv_scale) and dtype != tf.float32):
            raise ValueError(
                "unscale_and_check_finite: inv_scale must be a float32 scalar (1 / loss scale); "
                f"got {dtype.name}. Pass tf.cast(inv_scale, tf.float32)."
            )
    inv_scale = tf.convert_to_tensor(inv_scale, dtype=tf.float32)
    if inv_scale.shape.ndims is None:
        return _tf.ensure_shape(inv_scale, [])  # checked when the graph runs
    if inv_scale.shape.ndims != 0:
        raise ValueError(
            "unscale_and_check_finite: inv_scale must be a scalar (1 / loss scale); got shape "
            f"{inv_scale.shape}. Pass a scalar, e.g. tf.reshape(inv_scale, [])."
        )
    return inv_scale


def _unscale_fused(op_module, values, inv_scale):
    """One UnscaleAndCheckFinite node per device holding gradients; their flags ANDed."""
    return per_device(values, lambda group: op_module.unscale_and_check_finite(group, inv_scale))


def unscale_and_check_finite(grads, inv_scale, portable=False):
    """Returns ``(unscaled_grads, all_finite)`` for a list of gradients.

    Args:
      grads: list of ``Tensor`` / ``IndexedSlices`` / ``None`` (half, float or bfloat16).
      inv_scale: scalar float32 tensor or number, the reciprocal of the loss scale.
      portable: build stock TensorFlow ops only, so the graph loads where the op is not
        registered; the sessions that run the mixed-precision rewrite run them as the fused
        op (fusable.py).  The loss-scale optimizer's choice.

    Raises:
      ValueError: if ``grads`` holds no gradient at all, a gradient is not floating point,
        or ``inv_scale`` is not a float32 scalar.
    """
    grads = list(grads)
    present = _present_gradients(grads)
    op_module = None if portable else _LOADER.module()
    with _tf.name_scope("unscale_and_check_finite"):
        inv_scale = _scalar_float32(inv_scale)
        values = [_value_of(_dense_values(g)) for g in present]
        if op_module is None:
            unscaled, all_finite = unscale_with_stock_ops(values, inv_scale)
        else:
            unscaled, all_finite = _unscale_fused(op_module, values, inv_scale)
    unscaled = iter(unscaled)
    return [None if g is None else _with_values(g, next(unscaled)) for g in grads], all_finite
