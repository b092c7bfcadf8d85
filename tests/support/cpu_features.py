"""What this CPU offers the tests, probed at run time -- never decided by the CPU's name.

CPUs differ between developers', CI's and users' machines (AVX-512 or AVX2 only, with or
without AVX-512 BF16).  A test that needs a feature probes for it and skips with the
reason when it is missing; everything else runs everywhere.

``make test-avx2`` shows an AVX-512 machine what an AVX2-only one sees: it turns oneDNN
off (``TF_ENABLE_ONEDNN_OPTS=0``: TensorFlow's bfloat16 pass and oneDNN kernels go, as on
a CPU oneDNN cannot run bfloat16 on), caps oneDNN's ISA at AVX2 and the fused op's
kernel at AVX2 (``TFAMP_CPU_ISA``).  ``ONEDNN_MAX_CPU_ISA`` alone is not enough:
TensorFlow still picks oneDNN's bfloat16 kernels by the real CPU, which then crash.
"""
from __future__ import annotations

import functools
import os
from typing import FrozenSet

# The compiled ops' CPU kernel paths (custom_ops/unscale_and_check_finite/cpu_isa.h), slowest first.
ISAS = ("scalar", "avx2", "avx512")
_FLAGS_THAT_MATTER = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16",
                      "avx512_fp16", "amx_bf16", "amx_fp16")
_CAPS = ("ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS", "TFAMP_CPU_ISA")


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> dict:
    """The first processor's ``/proc/cpuinfo`` fields (empty where unreadable)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_flags() -> FrozenSet[str]:
    """The feature flags the kernel reports for this CPU (empty where unreadable)."""
    return frozenset(_cpuinfo().get("flags", "").split())


def onednn_disabled() -> bool:
    """Whether ``TF_ENABLE_ONEDNN_OPTS`` turns TensorFlow's oneDNN paths off."""
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false")


def describe_cpu() -> str:
    """One line: the CPU model, the flags that matter here, and any cap in force."""
    present = [flag for flag in _FLAGS_THAT_MATTER if flag in cpu_flags()]
    caps = ["%s=%s" % (name, os.environ[name]) for name in _CAPS if os.environ.get(name)]
    return "%s: %s%s" % (_cpuinfo().get("model name", "unknown CPU"), " ".join(present) or "no AVX",
                         " (%s)" % ", ".join(caps) if caps else "")
