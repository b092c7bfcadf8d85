"""Training in mixed precision reaches float32's accuracy (issue acceptance: within 1 point).

Each model trains twice with the same seed and data order, once in float32 and once with
``enable_mixed_precision_graph_rewrite`` (rewrite target ``cpu``, Tensor Core numerics
emulated, so the comparison does not depend on this CPU's half kernels):

* the conv net of ``examples/train_tf1`` on scikit-learn's digits;
* an LSTM classifier (``dynamic_rnn`` under control flow v1) on noisy copies of ten
  prototype sequences, with a 2000-sequence test set: digits' 360 test images cannot tell
  one accuracy point apart from the noise between two training runs.
"""
import importlib.util
import os
import random

import numpy as np
import pytest
import tensorflow as tf
from model_graphs import control_flow_v1
from repo_paths import EXAMPLES

import tfamp_rewrite
from tfamp_rewrite.training import activation

tf1 = tf.compat.v1
EXAMPLE = os.path.join(EXAMPLES, "train_tf1", "train.py")


def load_example():
    spec = importlib.util.spec_from_file_location("train_tf1_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cpu_amp(monkeypatch):
    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
    yield
    activation.deactivate()


def test_conv_net_amp_accuracy_within_one_point(cpu_amp):
    example = load_example()
    results = {}
    for amp in (False, True):
        with tf.Graph().as_default():
            flags = ["--steps", "250", "--log-every", "1000"] + (["--amp"] if amp else [])
            results[amp] = example.main(flags)
    assert results[False]["test_accuracy"] > 0.95
    assert abs(results[True]["test_accuracy"] - results[False]["test_accuracy"]) <= 0.01
    assert results[True]["loss_scale_variables"] and not results[False]["loss_scale_variables"]


def prototype_sequences(seed, noise=1.2, train=4000, test=2000):
    """Ten random 8x8 prototype sequences; samples are prototypes plus Gaussian noise."""
    prototypes = np.random.default_rng(100).standard_normal((10, 8, 8)).astype(np.float32)
    rng = np.random.default_rng(seed)

    def sample(count):
        labels = rng.integers(0, 10, count).astype(np.int32)
        return (prototypes[labels] + noise * rng.standard_normal((count, 8, 8))).astype(np.float32), labels

    return sample(train), sample(test)


def train_lstm(amp, steps=400, batch=32, units=32, seed=0):
    """Test accuracy of an LSTM classifier; the learning rate decays to 0 so it settles."""
    (train_x, train_y), (test_x, test_y) = prototype_sequences(seed)
    graph = tf.Graph()
    with graph.as_default(), control_flow_v1():
        tf1.set_random_seed(seed)
        random.seed(seed)  # tf1.layers' Keras initializers draw their seeds from it
        sequences = tf1.placeholder(tf.float32, [None, 8, 8])
        labels = tf1.placeholder(tf.int32, [None])
        outputs, _ = tf1.nn.dynamic_rnn(tf1.nn.rnn_cell.LSTMCell(units), sequences, dtype=tf.float32)
        logits = tf1.layers.dense(outputs[:, -1], 10)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.AdamOptimizer(tf1.train.polynomial_decay(0.01, step, steps, 0.0))
        if amp:
            optimizer = tfamp_rewrite.enable_mixed_precision_graph_rewrite(optimizer)
        train = optimizer.minimize(loss, global_step=step)
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
        accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
        rng = np.random.default_rng(seed)
        with tf1.Session() as session:
            assert isinstance(session, tfamp_rewrite.Session) == amp
            session.run(tf1.global_variables_initializer())
            for _ in range(steps):
                index = rng.integers(0, len(train_y), batch)
                session.run(train, {sequences: train_x[index], labels: train_y[index]})
            if amp:
                converted = session.rewrite_reports[0].op_counts["MatMul"]["converted"]
                assert converted > 0  # the LSTM's MatMuls ran in half
            return session.run(accuracy, {sequences: test_x, labels: test_y})


def test_lstm_classifier_amp_accuracy_within_one_point(cpu_amp):
    fp32, amp = train_lstm(amp=False), train_lstm(amp=True)
    assert fp32 > 0.95
    assert abs(amp - fp32) <= 0.01
