"""Whether Horovod can be built against a TensorFlow version, and if not, why (one line).

    python tests/support/horovod_support.py    # exit 0 if it can; else prints the reason, exit 1

``make horovod`` asks this before building; the distributed tests skip with the same
reason where it says no, and fail where it says yes but Horovod is missing.
"""
from __future__ import annotations

import re
import sys
from typing import Optional

# Horovod's xla_mpi_ops.cc includes XLA headers that TensorFlow 2.19 moved elsewhere.
FIRST_UNSUPPORTED_TF = (2, 19)


def unsupported_reason(tf_version: str) -> Optional[str]:
    """None if Horovod builds against TensorFlow ``tf_version``, else why not."""
    major_minor = tuple(int(part) for part in re.findall(r"\d+", tf_version)[:2])
    if major_minor >= FIRST_UNSUPPORTED_TF:
        return ("Horovod does not build against TensorFlow %s (TensorFlow >= %d.%d moved XLA "
                "headers it includes); the Horovod tests run on the pinned tensorflow-cpu==2.15.1"
                % ((tf_version,) + FIRST_UNSUPPORTED_TF))
    return None


if __name__ == "__main__":
    import tensorflow as tf

    reason = unsupported_reason(tf.__version__)
    if reason:
        print(reason)
    sys.exit(1 if reason else 0)
