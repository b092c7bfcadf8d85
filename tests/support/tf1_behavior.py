"""TF1 behaviour for the test run and the processes it starts (``pytest --tf1-behavior``).

TensorFlow 1.15's Python needs Python <= 3.7, which CI cannot install; TensorFlow 2.x with
``tf.compat.v1.disable_v2_behavior()`` is the stand-in: graph mode, reference variables
(``VariableV2``), control flow v1 (``Switch``/``Merge``, ``Enter``/``Exit``), TF1 shapes.
"""
from __future__ import annotations

import os

ENV = "TFAMP_TEST_TF1_BEHAVIOR"


def tf1_behavior_requested() -> bool:
    """True in a test run (or a process it started) that runs with TF1 behaviour."""
    return os.environ.get(ENV) == "1"


def use_tf1_behavior() -> None:
    """Switches this process to TF1 behaviour and marks it for processes it starts."""
    import tensorflow as tf

    os.environ[ENV] = "1"
    tf.compat.v1.disable_v2_behavior()


def python_prefix() -> list:
    """Arguments that make ``python`` run a script with TF1 behaviour when the run has it.

    ``[sys.executable, *python_prefix(), script, ...]``: the script runs unchanged, after
    ``disable_v2_behavior()``, as ``tests/support/scripts/tf1_launcher.py`` does it.
    """
    if not tf1_behavior_requested():
        return []
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "tf1_launcher.py")]
