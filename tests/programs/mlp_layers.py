"""An MLP built with ``tf.compat.v1.layers.dense``: the TF1 "layers API" classifier pattern.

Three dense layers with ReLU, ``tf.compat.v1.losses.sparse_softmax_cross_entropy``, an
``AdamOptimizer`` with a ``global_step`` and an accuracy op fetched beside the train op.
The data is made here: three interleaved noisy spirals in 2-D, lifted to 16 features,
with 15% of the labels redrawn at random.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches


def make_data(seed, per_class=300, classes=3, features=16):
    rng = np.random.RandomState(seed)
    points, labels = [], []
    for label in range(classes):
        radius = np.linspace(0.05, 1.0, per_class)
        angle = label * 2 * np.pi / classes + radius * 4.0 + rng.normal(0.0, 0.25, per_class)
        points.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))
        labels.append(np.full(per_class, label))
    points, labels = np.concatenate(points), np.concatenate(labels)
    noisy = rng.uniform(size=len(labels)) < 0.15  # label noise: the loss has a floor well above 0
    labels[noisy] = rng.randint(0, classes, noisy.sum())
    lift = rng.normal(0.0, 1.0, (2, features))
    inputs = np.concatenate([points, np.tanh(points.dot(lift[:, 2:]))], axis=1)
    return inputs.astype(np.float32), labels.astype(np.int32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    inputs, targets = make_data(DATA_SEED)

    features = tf1.placeholder(tf.float32, [None, inputs.shape[1]], name="features")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    net = tf1.layers.dense(features, 128, activation=tf.nn.relu, name="hidden1")
    net = tf1.layers.dense(net, 128, activation=tf.nn.relu, name="hidden2")
    logits = tf1.layers.dense(net, 3, name="logits")
    loss = tf1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
    global_step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.AdamOptimizer(0.003).minimize(loss, global_step=global_step)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            batch = rng.randint(0, len(targets), 64)
            _, loss_value, acc = sess.run([train_op, loss, accuracy],
                                          feed_dict={features: inputs[batch], labels: targets[batch]})
            losses.append(loss_value)
            if step % 50 == 0:
                print("step %d loss %.4f accuracy %.3f" % (step, loss_value, acc))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
