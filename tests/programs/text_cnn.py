"""A CNN for sentence classification: the TF1 "text CNN" tutorial pattern (Kim 2014).

Variables are ``tf.compat.v1.Variable`` (TensorFlow 1.x's ``tf.Variable``: ``VariableV2``).
An embedding matrix initialised with ``random_uniform`` and ``tf.nn.embedding_lookup``,
``expand_dims`` to a one-channel image, one ``tf.nn.conv2d`` + ReLU + ``max_pool`` over time
per filter width (3, 4, 5), the pooled features concatenated, ``dropout`` with a fed
``keep_prob``, a softmax layer with an L2 penalty, ``AdamOptimizer`` with a ``global_step``.
The sentences are made here: random tokens, labelled by which of two cue bigrams they contain.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches
VOCAB, LENGTH, CLASSES = 50, 30, 2
FILTER_SIZES, NUM_FILTERS, EMBEDDING = (3, 4, 5), 16, 16


def make_data(seed, count=2000):
    rng = np.random.RandomState(seed)
    sentences = rng.randint(4, VOCAB, (count, LENGTH)).astype(np.int32)
    labels = rng.randint(0, CLASSES, count)
    cues = np.array([[1, 2], [2, 3]])  # class 0 contains "1 2", class 1 "2 3"
    for row, label in enumerate(labels):
        position = rng.randint(0, LENGTH - 1)
        sentences[row, position:position + 2] = cues[label]
    noisy = rng.uniform(size=count) < 0.1  # label noise: the loss has a floor well above 0
    labels[noisy] = 1 - labels[noisy]
    return sentences, np.eye(CLASSES, dtype=np.float32)[labels]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    sentences, targets = make_data(DATA_SEED)

    input_x = tf1.placeholder(tf.int32, [None, LENGTH], name="input_x")
    input_y = tf1.placeholder(tf.float32, [None, CLASSES], name="input_y")
    keep_prob = tf1.placeholder(tf.float32, name="dropout_keep_prob")
    with tf1.name_scope("embedding"):
        w_embedding = tf1.Variable(tf1.random_uniform([VOCAB, EMBEDDING], -1.0, 1.0), name="W")
        embedded = tf.expand_dims(tf.nn.embedding_lookup(w_embedding, input_x), -1)
    pooled_outputs = []
    for filter_size in FILTER_SIZES:
        with tf1.name_scope("conv-maxpool-%s" % filter_size):
            filter_shape = [filter_size, EMBEDDING, 1, NUM_FILTERS]
            w = tf1.Variable(tf1.truncated_normal(filter_shape, stddev=0.1), name="W")
            b = tf1.Variable(tf.constant(0.1, shape=[NUM_FILTERS]), name="b")
            conv = tf.nn.conv2d(embedded, w, strides=[1, 1, 1, 1], padding="VALID", name="conv")
            h = tf.nn.relu(tf.nn.bias_add(conv, b), name="relu")
            pooled_outputs.append(tf1.nn.max_pool(h, ksize=[1, LENGTH - filter_size + 1, 1, 1],
                                                  strides=[1, 1, 1, 1], padding="VALID", name="pool"))
    num_filters_total = NUM_FILTERS * len(FILTER_SIZES)
    h_pool_flat = tf.reshape(tf.concat(pooled_outputs, 3), [-1, num_filters_total])
    h_drop = tf1.nn.dropout(h_pool_flat, keep_prob=keep_prob)
    with tf1.name_scope("output"):
        w = tf1.get_variable("W", shape=[num_filters_total, CLASSES],
                             initializer=tf1.glorot_uniform_initializer())
        b = tf1.Variable(tf.constant(0.1, shape=[CLASSES]), name="b")
        scores = tf1.nn.xw_plus_b(h_drop, w, b, name="scores")
    loss = tf.reduce_mean(tf1.nn.softmax_cross_entropy_with_logits_v2(logits=scores, labels=input_y))
    loss += 0.001 * (tf.nn.l2_loss(w) + tf.nn.l2_loss(b))
    global_step = tf1.Variable(0, name="global_step", trainable=False)
    train_op = tf1.train.AdamOptimizer(0.002).minimize(loss, global_step=global_step)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            batch = rng.randint(0, len(targets), 64)
            feed = {input_x: sentences[batch], input_y: targets[batch], keep_prob: 0.5}
            _, loss_value = sess.run([train_op, loss], feed_dict=feed)
            losses.append(loss_value)
            if step % 25 == 0:
                print("step %d loss %.4f" % (step, loss_value))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
