"""A char-RNN that feeds its LSTM state back: the TF1 PTB / char-rnn tutorial pattern.

A ``MultiRNNCell`` of two ``LSTMCell`` s unrolled by ``tf.compat.v1.nn.dynamic_rnn`` (a
``while_loop``: ``Enter``/``Exit`` under TF1 behaviour) from ``initial_state =
cell.zero_state(...)``, a tuple of ``LSTMStateTuple`` s.  Truncated backpropagation through
time: each step feeds the state the last step returned,
``state = sess.run(..., feed_dict={model.initial_state: state, ...})``, the nested-structure
feed of the TF docs.  Trained with ``tf.gradients`` + ``tf.clip_by_global_norm`` +
``opt.apply_gradients``.  The text is made here by a random order-2 Markov chain over 24
characters.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches

VOCAB = 24


def make_text(seed, length=20000):
    """Characters of a sparse random order-2 Markov chain (a few likely successors each)."""
    rng = np.random.RandomState(seed)
    logits = rng.normal(0.0, 2.5, (VOCAB, VOCAB, VOCAB))
    probs = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    text = [0, 1]
    for _ in range(length - 2):
        text.append(rng.choice(VOCAB, p=probs[text[-2], text[-1]]))
    return np.array(text, dtype=np.int32)


class CharModel:
    def __init__(self, batch_size, num_steps, hidden=64, layers=2):
        self.input_data = tf1.placeholder(tf.int32, [batch_size, num_steps], name="input_data")
        self.targets = tf1.placeholder(tf.int32, [batch_size, num_steps], name="targets")
        cell = tf1.nn.rnn_cell.MultiRNNCell([tf1.nn.rnn_cell.LSTMCell(hidden) for _ in range(layers)])
        self.initial_state = cell.zero_state(batch_size, tf.float32)
        embedding = tf1.get_variable("embedding", [VOCAB, hidden])
        inputs = tf.nn.embedding_lookup(embedding, self.input_data)
        outputs, self.final_state = tf1.nn.dynamic_rnn(cell, inputs, initial_state=self.initial_state)
        softmax_w = tf1.get_variable("softmax_w", [hidden, VOCAB])
        softmax_b = tf1.get_variable("softmax_b", [VOCAB])
        logits = tf.matmul(tf.reshape(outputs, [-1, hidden]), softmax_w) + softmax_b
        self.cost = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(self.targets, [-1]), logits=logits))
        tvars = tf1.trainable_variables()
        grads, _ = tf.clip_by_global_norm(tf.gradients(self.cost, tvars), 5.0)
        optimizer = tf1.train.AdamOptimizer(0.005)
        self.train_op = optimizer.apply_gradients(zip(grads, tvars))


def batches(text, batch_size, num_steps):
    """The PTB reader's order: ``batch_size`` parallel streams, consecutive windows of each."""
    stream_length = len(text) // batch_size
    streams = text[:batch_size * stream_length].reshape(batch_size, stream_length)
    while True:
        for start in range(0, stream_length - num_steps - 1, num_steps):
            yield streams[:, start:start + num_steps], streams[:, start + 1:start + num_steps + 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    text = make_text(DATA_SEED)
    model = CharModel(batch_size=16, num_steps=20)

    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        state = sess.run(model.initial_state)
        windows = batches(text, 16, 20)
        for step in range(args.steps):
            x, y = next(windows)
            feed = {model.input_data: x, model.targets: y, model.initial_state: state}
            cost, state, _ = sess.run([model.cost, model.final_state, model.train_op], feed_dict=feed)
            losses.append(cost)
            if step % 25 == 0:
                print("step %d loss %.4f" % (step, cost))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
