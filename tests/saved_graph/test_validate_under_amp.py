"""``--validate`` compares with the original graph run as it is, even where mixed precision is on.

NGC containers set ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` for every process, the command line's
too: its reference run must not be rewritten by the sessions that activation switches on.
"""
import numpy as np
import pytest
import saved_graph_models as models
from cli_helpers import run_main

from tfamp_rewrite.training import activation


@pytest.fixture
def amp_active(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    activation.enable_graph_rewrite()
    yield
    activation.deactivate()


def test_validation_still_sees_float16_overflow(amp_active, tmp_path, capsys):
    source = models.frozen_net(str(tmp_path / "net.pb"))
    inputs = models.overflow_inputs(str(tmp_path / "inputs.npz"))  # inf in float16, finite in float32
    code, out, err = run_main(capsys, "convert", source, str(tmp_path / "out.pb"), "--target", "cpu",
                              "--validate", "--input-data", inputs)
    assert code == 1, out + err  # a reference rewritten to float16 would overflow too, and "agree"
    assert "FAILED" in out and not (tmp_path / "out.pb").exists()


def test_the_reference_session_is_plain_tensorflow(amp_active):
    import tensorflow as tf

    from tfamp_rewrite.saved_graph.plain_session import plain_session

    graph = tf.Graph()
    with graph.as_default():
        big = tf.constant(np.full([1, 4], 2.0 ** 10, np.float32))
        probe = tf.matmul(big, tf.transpose(big))
    with tf.compat.v1.Session(graph=graph) as rewriting, plain_session(graph) as plain:
        assert np.isinf(rewriting.run(probe)).all()  # activation is really on
        assert np.isfinite(plain.run(probe)).all()
        assert plain.__class__.__mro__[1] is tf.compat.v1.Session
