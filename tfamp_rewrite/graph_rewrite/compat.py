"""Which TensorFlow's AMP pass a rewrite reproduces: the ``compat`` setting.

``compat`` names a TensorFlow version's op lists and painting algorithm:

* ``"tf1.15"``: TensorFlow 1.15 (white / gray / black lists, Stack / TensorArray colour
  matching, no infer-after-allow; output readable by TensorFlow 1.15);
* ``"tf2.15"``: TensorFlow 2.x before infer-after-allow applied to float16;
* ``"latest"``: newer TensorFlow, where infer-after-allow applies in every mode;
* ``"auto"`` (the default everywhere): the one of the TensorFlow that is running, so a
  plugin inside TensorFlow 1.15 does by default what TensorFlow 1.15's own pass does.

Infer-after-allow (Grappler's pass 4, ``AddInferToAllowIfFollowAllow``: an infer op whose
direct input is an allow op becomes half) began for bfloat16 only (oneDNN's pass, 2021:
tensorflow/tensorflow#52970 "Update MKL auto-mixed precision algorithm"); through
TensorFlow 2.19 the function returns early unless the mode is bfloat16.
tensorflow/tensorflow#84874 "[oneDNN] Add Infer after last allow to be added to Allow
list" (opened 2025-01-14, merged mid-2025) removed that early return, so from TensorFlow
2.20 on it applies to float16 too, the CUDA lists included.  Measured with each release's
own ``auto_mixed_precision_cpu`` pass on MatMul -> Tanh: the Tanh stays float32 in
tensorflow-cpu 2.15.1, 2.16.2, 2.17.1, 2.18.1 and 2.19.1, and becomes float16 in 2.20.0
and 2.21.0.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Tuple

COMPATS = ("latest", "tf2.15", "tf1.15")
AUTO = "auto"
COMPAT_ENV = "TFAMP_REWRITE_COMPAT"
# The first TensorFlow release whose AMP pass applies infer-after-allow to float16.
FP16_INFER_AFTER_ALLOW_SINCE: Tuple[int, int] = (2, 20)


def compat_of_tensorflow(version: str, dtype: str = "float16") -> str:
    """The compat whose algorithm TensorFlow ``version`` runs for ``dtype``.

    1.x -> ``"tf1.15"`` (``"latest"`` for bfloat16: TensorFlow 1.15 has no bfloat16 pass, so
    the newest algorithm is the one to follow); 2.x before FP16_INFER_AFTER_ALLOW_SINCE ->
    ``"tf2.15"``; later -> ``"latest"``.
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError("cannot read a TensorFlow version from %r" % (version,))
    major_minor = (int(match.group(1)), int(match.group(2)))
    if major_minor[0] < 2:
        return "tf1.15" if dtype == "float16" else "latest"
    return "tf2.15" if major_minor < FP16_INFER_AFTER_ALLOW_SINCE else "latest"


def running_tensorflow_version() -> str:
    from tensorflow.python.framework import versions  # the same module in 1.15 and 2.x

    return versions.__version__


def resolve_compat(compat: Optional[str] = AUTO, dtype: str = "float16") -> str:
    """``compat`` itself, or for ``"auto"`` / None the running TensorFlow's (see the module doc)."""
    if compat is None or compat == AUTO:
        return compat_of_tensorflow(running_tensorflow_version(), dtype)
    if compat not in COMPATS:
        raise ValueError("compat=%r is not supported; use %s, or 'auto' for the running "
                         "TensorFlow's" % (compat, ", ".join(repr(c) for c in COMPATS)))
    return compat


def session_compat(compat: Optional[str] = None, environ: Mapping[str, str] = None) -> str:
    """The compat setting of a session: ``compat``, else ``$TFAMP_REWRITE_COMPAT``, else auto.

    Returns the setting unresolved (``"auto"`` stays ``"auto"``) after validating it, so a
    bad environment variable fails when the session is created, naming the variable.
    """
    environ = os.environ if environ is None else environ
    if compat is not None:
        setting = compat
    else:
        setting = environ.get(COMPAT_ENV, "").strip().lower() or AUTO
        if setting != AUTO and setting not in COMPATS:
            raise ValueError("%s=%r is not a compat; use auto (the running TensorFlow's), %s"
                             % (COMPAT_ENV, setting, ", ".join(COMPATS)))
    resolve_compat(setting)  # validates
    return setting
