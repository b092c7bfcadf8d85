"""TensorFlow 1.15 itself: its wheel (downloaded once), its runtime and 2.x's, each in a child
process, and a closing summary of what the checks verified.

The wheel cannot be had without network access the first time: the fixtures then fail
(never skip), saying so.
"""
import collections

import pytest

# What the summary lists, in this order; verified(topic, line) adds a line under a topic.
TOPICS = ("TensorFlow 1.15 runtime", "fused op", "graphs rewritten by the pass",
          "graphs converted by tfamp-rewrite", "graphs saved from training", "API surface")
_VERIFIED = collections.defaultdict(list)


@pytest.fixture(scope="session")
def tf115_tree():
    """The unpacked TensorFlow 1.15 wheel (``tf115_wheel.Tf115Tree``)."""
    from tf115_wheel import Tf115Unavailable, tf115_tree

    try:
        return tf115_tree()
    except Tf115Unavailable as error:
        pytest.fail("TensorFlow 1.15 is not available: %s" % error, pytrace=False)


@pytest.fixture(scope="session")
def tf115(tf115_tree):
    """TensorFlow 1.15's runtime (``runtime_process.RuntimeProcess``)."""
    from runtime_process import tf115_process

    with tf115_process(tf115_tree) as process:
        yield process


@pytest.fixture(scope="session")
def tf2():
    """This Python's TensorFlow 2.x in a child process, with the Eigen kernels 1.15 has."""
    from runtime_process import tf2_process

    with tf2_process() as process:
        yield process


@pytest.fixture(scope="session")
def verified():
    """``verified(topic, line)``: adds a line to the summary printed after the tests."""
    def add(topic: str, line: str) -> None:
        assert topic in TOPICS, topic
        _VERIFIED[topic].append(line)

    return add


def pytest_terminal_summary(terminalreporter):
    if _VERIFIED:
        terminalreporter.section("verified against TensorFlow 1.15")
        for topic in TOPICS:
            for line in _VERIFIED.get(topic, ()):
                terminalreporter.write_line("%s: %s" % (topic, line))
