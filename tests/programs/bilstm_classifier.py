"""A bidirectional LSTM over variable-length sequences: the TF1 sequence-classifier pattern.

Token embeddings into ``tf.compat.v1.nn.bidirectional_dynamic_rnn`` with ``sequence_length``
(padded batches; each direction stops at its sequence's length), the two final hidden
states concatenated into a softmax classifier, ``RMSPropOptimizer``.  The sequences are made
here: random tokens, 4 to 24 long, labelled by whether token 1 appears before token 2, 10%
of the labels flipped.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches

VOCAB, MAX_LEN = 12, 24


def make_data(seed, count=2000):
    rng = np.random.RandomState(seed)
    lengths = rng.randint(4, MAX_LEN + 1, count)
    tokens = np.zeros((count, MAX_LEN), dtype=np.int32)
    labels = np.zeros(count, dtype=np.int32)
    for row, length in enumerate(lengths):
        sequence = rng.randint(3, VOCAB, length)
        first, second = rng.choice(length, 2, replace=False)
        sequence[first], sequence[second] = 1, 2
        tokens[row, :length] = sequence
        labels[row] = int(first < second)
    noisy = rng.uniform(size=count) < 0.1  # label noise: the loss has a floor well above 0
    labels[noisy] = 1 - labels[noisy]
    return tokens, lengths.astype(np.int32), labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=180)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    tokens, lengths, targets = make_data(DATA_SEED)

    inputs = tf1.placeholder(tf.int32, [None, MAX_LEN], name="tokens")
    sequence_length = tf1.placeholder(tf.int32, [None], name="sequence_length")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    embedding = tf1.get_variable("embedding", [VOCAB, 16])
    embedded = tf.nn.embedding_lookup(embedding, inputs)
    cell_fw = tf1.nn.rnn_cell.LSTMCell(32)
    cell_bw = tf1.nn.rnn_cell.LSTMCell(32)
    _, (state_fw, state_bw) = tf1.nn.bidirectional_dynamic_rnn(
        cell_fw, cell_bw, embedded, sequence_length=sequence_length, dtype=tf.float32)
    final = tf.concat([state_fw.h, state_bw.h], axis=1)
    logits = tf1.layers.dense(final, 2, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf1.train.RMSPropOptimizer(0.005).minimize(loss)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            batch = rng.randint(0, len(targets), 32)
            _, loss_value = sess.run([train_op, loss], feed_dict={
                inputs: tokens[batch], sequence_length: lengths[batch], labels: targets[batch]})
            losses.append(loss_value)
            if step % 20 == 0:
                print("step %d loss %.4f" % (step, loss_value))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
