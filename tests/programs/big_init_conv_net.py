"""A raw-variable conv net initialised with ``random_normal(stddev=1)``: logits of ~1e5.

The TF1 "Deep MNIST" pattern (``tf.compat.v1.Variable`` weights, two ``conv2d`` +
``max_pool`` layers, a fully connected layer written with ``tf.matmul``, softmax
cross-entropy) as tutorials that skip the scaled initialisation write it: every weight
``random_normal(shape, stddev=1.0)``, on unnormalised pixel values.  Float32 trains from a
huge loss (plain SGD, a small learning rate); in float16 the logits' MatMul overflows 65504
from the first step, so without help every loss-scaled step is skipped for ever.  The images
are made here: 16x16 noisy copies of four random class templates.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches


def make_data(seed, count=512, size=16, classes=4):
    rng = np.random.RandomState(seed)
    templates = rng.uniform(0.0, 1.0, (classes, size, size, 1))
    labels = rng.randint(0, classes, count)
    images = templates[labels] + rng.normal(0.0, 2.5, (count, size, size, 1))
    return images.astype(np.float32), np.eye(classes, dtype=np.float32)[labels]


def weight_variable(shape):
    return tf1.Variable(tf1.random_normal(shape, stddev=1.0))


def bias_variable(shape):
    return tf1.Variable(tf.constant(0.1, shape=shape))


def conv2d(x, w):
    return tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")


def max_pool_2x2(x):
    return tf1.nn.max_pool(x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning_rate", type=float, default=1e-7)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    images, labels = make_data(DATA_SEED)
    images = images * 8.0  # unnormalised pixel values, as the tutorials this copies feed them

    x = tf1.placeholder(tf.float32, [None, 16, 16, 1], name="x")
    y_ = tf1.placeholder(tf.float32, [None, 4], name="y_")
    w_conv1 = weight_variable([5, 5, 1, 16])
    h_pool1 = max_pool_2x2(tf.nn.relu(conv2d(x, w_conv1) + bias_variable([16])))
    w_conv2 = weight_variable([5, 5, 16, 32])
    h_pool2 = max_pool_2x2(tf.nn.relu(conv2d(h_pool1, w_conv2) + bias_variable([32])))
    h_flat = tf.reshape(h_pool2, [-1, 4 * 4 * 32])
    h_fc1 = tf.nn.relu(tf.matmul(h_flat, weight_variable([4 * 4 * 32, 64])) + bias_variable([64]))
    y_conv = tf.matmul(h_fc1, weight_variable([64, 4])) + bias_variable([4])
    cross_entropy = tf.reduce_mean(tf1.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=y_conv))
    train_step = tf1.train.GradientDescentOptimizer(args.learning_rate).minimize(cross_entropy)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            batch = rng.randint(0, len(images), 32)
            _, loss = sess.run([train_step, cross_entropy], feed_dict={x: images[batch], y_: labels[batch]})
            losses.append(loss)
            if step % 25 == 0:
                print("step %d loss %.4f" % (step, loss))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
