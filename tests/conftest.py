"""Test-wide settings: quiet TensorFlow, TensorFlow's own AMP pass as a real fp16 rewrite, Horovod ranks.

``--tf1-behavior`` runs the tests as TF1 programs run: ``tf.compat.v1.disable_v2_behavior()``
before any test module is imported (reference variables, Switch/Merge conds, Enter/Exit
loops, graph mode everywhere); tests of TF2 features carry ``@pytest.mark.tf2_behavior``
and skip there with their reason, tests of what only TF1 behaviour builds carry
``@pytest.mark.tf1_behavior`` and run there only.  Processes the tests start inherit it through
``TFAMP_TEST_TF1_BEHAVIOR=1`` (tests/support/tf1_behavior.py).
"""
import os
import sys

import pytest

# Read by TensorFlow at import / rewrite time, so set before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"] = "0"

# Shared helpers (graphs, runners, oracles) are imported by bare name from tests/support.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))


@pytest.fixture(autouse=True)
def no_heals_from_earlier_tests(monkeypatch):
    """Sessions keep what earlier sessions of the process healed; each test starts afresh."""
    from tfamp_rewrite.training import heal_memory

    monkeypatch.setattr(heal_memory, "_healed_in_process", {})
    monkeypatch.setattr(heal_memory, "_layers_in_process", {})


def pytest_addoption(parser):
    parser.addoption("--tf1-behavior", action="store_true", default=False,
                     help="run with tf.compat.v1.disable_v2_behavior(), as TF1 programs do")


def pytest_configure(config):
    config.addinivalue_line("markers", "tf2_behavior(reason): tests a TensorFlow 2 feature; "
                            "skipped under --tf1-behavior with the reason")
    config.addinivalue_line("markers", "tf1_behavior(reason): builds what only TF1 behaviour builds; "
                            "runs in the --tf1-behavior pass only")
    config.addinivalue_line("markers", "own_processes(reason): its programs run in new processes that "
                            "set their own behaviour; the main pass runs it, --tf1-behavior skips it")
    if config.getoption("--tf1-behavior"):
        from tf1_behavior import use_tf1_behavior

        use_tf1_behavior()


# The longest modules (pytest --durations on a 2-core machine), run first: ``make test`` deals
# whole modules out to its worker processes in this order (pytest-xdist --dist loadscope), and
# the workers finish together only if the long ones do not come last.
LONGEST_MODULES_FIRST = (
    "tests/programs/test_programs.py",
    "tests/examples/test_example_resnet50.py",
    "tests/training/test_activation_matrix.py",
    "tests/examples/test_example_doctor.py",
    "tests/examples/test_example_transformer.py",
    "tests/saved_graph/test_cli_doctor.py",
    "tests/saved_graph/test_cli_formats.py",
    "tests/saved_graph/test_deterministic_output.py",
    "tests/training/test_zero_code_change.py",
    "tests/saved_graph/test_cli_fuzz.py",
    "tests/saved_graph/test_cli_resnet50.py",
    "tests/examples/test_example_train_tf1_horovod.py",
    "tests/training/test_horovod_wrap_orders.py",
)


def _schedule_rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONGEST_MODULES_FIRST.index(path) if path in LONGEST_MODULES_FIRST else len(LONGEST_MODULES_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_schedule_rank)  # stable: the other modules keep their order
    tf1 = config.getoption("--tf1-behavior")
    for item in items:
        for name, why in ((("tf2_behavior", "TF2 behaviour only: %s"),
                           ("own_processes", "the same in both passes (its programs set their own "
                                             "behaviour), so the main pass runs it: %s"))
                          if tf1 else (("tf1_behavior", "runs in the --tf1-behavior pass: %s"),)):
            marker = item.get_closest_marker(name)
            if marker is not None:
                reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
                item.add_marker(pytest.mark.skip(reason=why % reason))


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
