"""Test-wide settings: quiet TensorFlow, TensorFlow's own AMP pass as a real fp16 rewrite, Horovod ranks."""
import os
import sys

import pytest

# Read by TensorFlow at import / rewrite time, so set before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"] = "0"

# Shared helpers (graphs, runners, oracles) are imported by bare name from tests/support.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))


@pytest.fixture(scope="session")
def horovod_ranks():
    """``horovod_launch.run_ranks``, for tests that run real Horovod ranks.

    Skips where Horovod cannot be built against the installed TensorFlow (the reason says
    why); fails where it can but is not installed, so CI really runs the distributed tests.
    """
    import tensorflow as tf
    from horovod_support import unsupported_reason

    reason = unsupported_reason(tf.__version__)
    if reason:
        pytest.skip(reason)
    try:
        import horovod.tensorflow  # noqa: F401
        from horovod_launch import run_ranks
    except ImportError as error:
        pytest.fail("Horovod is not installed for TensorFlow %s (%s); `make horovod` builds it."
                    % (tf.__version__, error))
    return run_ranks
