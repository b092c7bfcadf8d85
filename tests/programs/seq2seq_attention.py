"""A seq2seq model with attention whose decoder is a ``while_loop``: the TF1 NMT pattern
written by hand (no ``tf.contrib``).

Encoder: token embeddings into ``tf.compat.v1.nn.dynamic_rnn`` over an ``LSTMCell``.
Decoder: a ``tf.compat.v1.while_loop`` (``Enter``/``Exit``/``Switch``/``Merge``/
``NextIteration`` under TF1 behaviour) that steps an ``LSTMCell`` with Luong "general"
attention and input feeding, writing each step's logits to a ``TensorArray``; trained with
teacher forcing (its gradient is the loop's gradient loop, with stacks), ``tf.gradients``,
``clip_by_global_norm`` and ``AdamOptimizer``.  A second ``while_loop`` decodes greedily
with the same weights for the accuracy printed at the end.  The task is made here:
reverse a random sequence of 4 to 8 digits (then EOS), 5% of the target digits corrupted.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches
PAD, GO, EOS = 0, 1, 2
VOCAB, MAX_SOURCE, HIDDEN = 13, 8, 64
MAX_TARGET = MAX_SOURCE + 1


def make_data(seed, count=4000):
    rng = np.random.RandomState(seed)
    source = np.zeros((count, MAX_SOURCE), dtype=np.int32)
    target = np.zeros((count, MAX_TARGET), dtype=np.int32)
    lengths = rng.randint(4, MAX_SOURCE + 1, count).astype(np.int32)
    for row, length in enumerate(lengths):
        digits = rng.randint(3, VOCAB, length)
        source[row, :length] = digits
        reversed_digits = digits[::-1].copy()
        noisy = rng.uniform(size=length) < 0.05
        reversed_digits[noisy] = rng.randint(3, VOCAB, noisy.sum())
        target[row, :length + 1] = np.append(reversed_digits, EOS)
    return source, lengths, target


class Attention:
    """Luong "general" attention with input feeding; weights made once, outside the loops."""

    def __init__(self, memory, source_mask):
        self.memory = memory
        self.source_mask = source_mask
        self.w_a = tf1.get_variable("w_a", [HIDDEN, HIDDEN])
        self.w_c = tf1.get_variable("w_c", [2 * HIDDEN, HIDDEN])

    def __call__(self, query):
        keys = tf.einsum("bsh,hk->bsk", self.memory, self.w_a)
        scores = tf.squeeze(tf.matmul(keys, tf.expand_dims(query, 2)), 2)
        scores += (1.0 - self.source_mask) * -1e9
        alignments = tf.nn.softmax(scores)
        context = tf.reduce_sum(tf.expand_dims(alignments, 2) * self.memory, 1)
        return tf.tanh(tf.matmul(tf.concat([context, query], 1), self.w_c))


def decode(cell, attention, embedding, w_out, initial_state, batch_size, next_input):
    """Runs the decoder for MAX_TARGET steps in a ``while_loop``; ``next_input(t, logits)``
    gives the token ids fed at step ``t + 1``. Returns logits [batch, time, vocab]."""
    def body(t, inputs, state, attentional, outputs):
        cell_input = tf.concat([tf.nn.embedding_lookup(embedding, inputs), attentional], 1)
        cell_output, state = cell(cell_input, state)
        attentional = attention(cell_output)
        logits = tf.matmul(attentional, w_out)
        return t + 1, next_input(t, logits), state, attentional, outputs.write(t, logits)

    start = (tf.constant(0), tf.fill([batch_size], GO), initial_state,
             tf.zeros([batch_size, HIDDEN]), tf.TensorArray(tf.float32, size=MAX_TARGET))
    _, _, _, _, outputs = tf1.while_loop(lambda t, *_: t < MAX_TARGET, body, start)
    return tf.transpose(outputs.stack(), [1, 0, 2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=160)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    sources, source_lengths, targets = make_data(DATA_SEED)

    source = tf1.placeholder(tf.int32, [None, MAX_SOURCE], name="source")
    source_length = tf1.placeholder(tf.int32, [None], name="source_length")
    target = tf1.placeholder(tf.int32, [None, MAX_TARGET], name="target")
    batch_size = tf.shape(source)[0]
    embedding = tf1.get_variable("embedding", [VOCAB, HIDDEN])
    with tf1.variable_scope("encoder"):
        memory, encoder_state = tf1.nn.dynamic_rnn(
            tf1.nn.rnn_cell.LSTMCell(HIDDEN), tf.nn.embedding_lookup(embedding, source),
            sequence_length=source_length, dtype=tf.float32)
    with tf1.variable_scope("decoder"):
        cell = tf1.nn.rnn_cell.LSTMCell(HIDDEN)
        attention = Attention(memory, tf.sequence_mask(source_length, MAX_SOURCE, dtype=tf.float32))
        w_out = tf1.get_variable("w_out", [HIDDEN, VOCAB])
        train_logits = decode(cell, attention, embedding, w_out, encoder_state, batch_size,
                              lambda t, logits: target[:, tf.minimum(t, MAX_TARGET - 1)])
        greedy_logits = decode(cell, attention, embedding, w_out, encoder_state, batch_size,
                               lambda t, logits: tf.argmax(logits, 1, output_type=tf.int32))
    target_mask = tf.sequence_mask(source_length + 1, MAX_TARGET, dtype=tf.float32)
    crossent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=train_logits)
    loss = tf.reduce_sum(crossent * target_mask) / tf.reduce_sum(target_mask)
    params = tf1.trainable_variables()
    grads, _ = tf.clip_by_global_norm(tf.gradients(loss, params), 5.0)
    train_op = tf1.train.AdamOptimizer(0.005).apply_gradients(zip(grads, params))
    correct = tf.cast(tf.equal(tf.argmax(greedy_logits, 2, output_type=tf.int32), target), tf.float32)
    greedy_accuracy = tf.reduce_sum(correct * target_mask) / tf.reduce_sum(target_mask)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            batch = rng.randint(0, len(targets), 32)
            feed = {source: sources[batch], source_length: source_lengths[batch], target: targets[batch]}
            _, loss_value = sess.run([train_op, loss], feed_dict=feed)
            losses.append(loss_value)
            if step % 40 == 0:
                print("step %d loss %.4f" % (step, loss_value))
        batch = rng.randint(0, len(targets), 256)
        accuracy = sess.run(greedy_accuracy, feed_dict={
            source: sources[batch], source_length: source_lengths[batch], target: targets[batch]})
        print("greedy decoding accuracy %.3f" % accuracy)
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
