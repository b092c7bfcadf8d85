"""Where sessions rewrite: the GPUs this process sees, and the rewrite-target setting.

Sessions rewrite for the GPU when one of compute capability >= 7.0 is visible (>= 8.0
for bfloat16), as Grappler's pass requires.  Otherwise they run the graph unchanged and
log once why -- unless the target is set to ``cpu`` (``TFAMP_REWRITE_TARGET=cpu`` or
``set_rewrite_target("cpu")``), which rewrites CPU nodes too, as TensorFlow's
``auto_mixed_precision_cpu`` does; ``gpu`` forces the GPU rewrite; ``auto`` decides.

``TFAMP_REWRITE_NUMERICS=emulate`` makes sessions run half nodes as float32 kernels on
values rounded to half (what a Tensor Core GPU computes; see graph_rewrite/emulation.py),
``native`` (the default) runs half kernels.
"""
from __future__ import annotations

import logging
import os
import re
from typing import List, Optional, Tuple

TARGET_ENV = "TFAMP_REWRITE_TARGET"
DTYPE_ENV = "TFAMP_REWRITE_DTYPE"
NUMERICS_ENV = "TFAMP_REWRITE_NUMERICS"
NODES_TO_EXCLUDE_ENV = "TFAMP_REWRITE_NODES_TO_EXCLUDE"
_NUMERICS = ("native", "emulate")
_SETTINGS = ("auto", "gpu", "cpu")
_MIN_CAPABILITY = {"float16": (7, 0), "bfloat16": (8, 0)}
_logger = logging.getLogger("tfamp_rewrite")
_python_setting: Optional[str] = None
_capabilities: Optional[List[Tuple[int, int]]] = None
_logged: set = set()


def set_rewrite_target(target: Optional[str]) -> None:
    """Sets the rewrite target for sessions: ``"auto"``, ``"gpu"``, ``"cpu"``, or None (env)."""
    global _python_setting
    if target is not None and target not in _SETTINGS:
        raise ValueError("rewrite target %r is not one of %s" % (target, ", ".join(_SETTINGS)))
    _python_setting = target


def rewrite_target_setting() -> str:
    setting = _python_setting or os.environ.get(TARGET_ENV, "auto").strip().lower() or "auto"
    if setting not in _SETTINGS:
        raise ValueError("%s=%r is not one of %s" % (TARGET_ENV, setting, ", ".join(_SETTINGS)))
    return setting


def session_dtype(dtype: Optional[str] = None) -> str:
    """The dtype sessions convert to: ``dtype``, else ``$TFAMP_REWRITE_DTYPE``, else float16."""
    dtype = dtype or os.environ.get(DTYPE_ENV, "").strip() or "float16"
    if dtype not in _MIN_CAPABILITY:
        raise ValueError("rewrite dtype %r is not supported; use float16 or bfloat16" % dtype)
    return dtype


def session_numerics(numerics: Optional[str] = None) -> str:
    """How sessions run half nodes: ``numerics``, else ``$TFAMP_REWRITE_NUMERICS``, else native."""
    numerics = numerics or os.environ.get(NUMERICS_ENV, "").strip().lower() or "native"
    if numerics not in _NUMERICS:
        raise ValueError("%s=%r is not supported; use native (half kernels) or emulate (float32 "
                         "kernels on values rounded to half)" % (NUMERICS_ENV, numerics))
    return numerics


def session_nodes_to_exclude(patterns=None) -> List["re.Pattern"]:
    """The nodes sessions keep float32 by name: ``patterns`` (regular expressions matched
    from the start of node names, as the log lines give them: ``'^logits$'``), else
    ``$TFAMP_REWRITE_NODES_TO_EXCLUDE``, comma-separated; compiled."""
    if patterns is None:
        patterns = [p.strip() for p in os.environ.get(NODES_TO_EXCLUDE_ENV, "").split(",") if p.strip()]
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError("%s: %r is not a regular expression (%s); give node names or "
                             "patterns such as '^dense/MatMul$', comma-separated"
                             % (NODES_TO_EXCLUDE_ENV, pattern, error)) from None
    return compiled


def nodes_to_exclude_setting(patterns: List[str]) -> str:
    """The setting that keeps the nodes ``patterns`` match float32 in every session:
    ``TFAMP_REWRITE_NODES_TO_EXCLUDE='^a$,^b$'``, as a fix in a log line gives it."""
    return "%s='%s'" % (NODES_TO_EXCLUDE_ENV, ",".join(patterns))


def gpu_compute_capabilities() -> List[Tuple[int, int]]:
    """Compute capabilities of the visible GPUs (cached; empty without GPUs)."""
    global _capabilities
    if _capabilities is None:
        _capabilities = _query_capabilities()
    return list(_capabilities)


def _query_capabilities() -> List[Tuple[int, int]]:
    import tensorflow as tf

    config = getattr(tf, "config", None)
    details = getattr(getattr(config, "experimental", None), "get_device_details", None)
    if details is not None and hasattr(config, "list_physical_devices"):  # TF >= 2.3
        result = []
        for gpu in config.list_physical_devices("GPU"):
            capability = details(gpu).get("compute_capability")
            if capability:
                result.append(tuple(capability))
        return result
    from tensorflow.python.client import device_lib  # TF 1.15

    session_config = tf.compat.v1.ConfigProto()
    session_config.gpu_options.allow_growth = True  # do not grab the GPU's memory to ask
    result = []
    for device in device_lib.list_local_devices(session_config):
        match = re.search(r"compute capability: (\d+)\.(\d+)", device.physical_device_desc)
        if device.device_type == "GPU" and match:
            result.append((int(match.group(1)), int(match.group(2))))
    return result


def session_rewrite_target(dtype: str = "float16") -> Tuple[Optional[str], str]:
    """``(target, why)``: ``"gpu"``, ``"cpu"`` or None (run unchanged), and the reason."""
    setting = rewrite_target_setting()
    if setting == "cpu":
        return "cpu", "rewrite target set to cpu"
    if setting == "gpu":
        return "gpu", "rewrite target set to gpu"
    needed = _MIN_CAPABILITY[dtype]
    capabilities = gpu_compute_capabilities()
    if any(capability >= needed for capability in capabilities):
        return "gpu", "GPU of compute capability >= %d.%d visible" % needed
    seen = ", ".join("%d.%d" % c for c in capabilities) or "none"
    return None, ("no GPU of compute capability >= %d.%d is visible (found: %s), so %s runs the "
                  "graph unchanged; set %s=cpu to rewrite CPU nodes anyway"
                  % (needed + (seen, dtype + " AMP", TARGET_ENV)))


def first_time(key: str) -> bool:
    """True the first time this process asks about ``key`` (kept with what ``log_once``
    said): a line whose text varies, said once per process, not per session."""
    if key in _logged:
        return False
    _logged.add(key)
    return True


def log_once(message: str, key: str = None) -> None:
    """Logs ``message`` as a warning the first time only (the first time of ``key``, when
    given: a line whose text varies)."""
    if first_time(message if key is None else key):
        _logger.warning(message)
