"""A GAN with two optimizers: the TF1 "vanilla GAN" tutorial pattern.

A generator and a discriminator MLP in their own ``variable_scope`` s (the discriminator
applied twice with ``reuse=True``), sigmoid cross-entropy losses, and two ``AdamOptimizer`` s
each restricted by ``var_list`` to one network's variables from the ``TRAINABLE_VARIABLES``
collection; every step runs a discriminator update, then a generator update.  The real data
is made here: a ring of eight 2-D Gaussians.  The final loss is discriminator + generator loss.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

NOISE = 8


def real_samples(rng, count):
    centre = rng.randint(0, 8, count) * (2 * np.pi / 8)
    points = 2.0 * np.stack([np.cos(centre), np.sin(centre)], axis=1) + rng.normal(0.0, 0.1, (count, 2))
    return points.astype(np.float32)


def generator(z):
    with tf1.variable_scope("generator"):
        net = tf1.layers.dense(z, 64, activation=tf.nn.relu, name="g1")
        net = tf1.layers.dense(net, 64, activation=tf.nn.relu, name="g2")
        return tf1.layers.dense(net, 2, name="g_out")


def discriminator(x, reuse=False):
    with tf1.variable_scope("discriminator", reuse=reuse):
        net = tf1.layers.dense(x, 64, activation=tf.nn.leaky_relu, name="d1")
        net = tf1.layers.dense(net, 64, activation=tf.nn.leaky_relu, name="d2")
        return tf1.layers.dense(net, 1, name="d_out")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)

    real = tf1.placeholder(tf.float32, [None, 2], name="real")
    z = tf1.placeholder(tf.float32, [None, NOISE], name="z")
    fake = generator(z)
    d_real = discriminator(real)
    d_fake = discriminator(fake, reuse=True)
    d_loss_real = tf.nn.sigmoid_cross_entropy_with_logits(logits=d_real, labels=tf.ones_like(d_real))
    d_loss_fake = tf.nn.sigmoid_cross_entropy_with_logits(logits=d_fake, labels=tf.zeros_like(d_fake))
    d_loss = tf.reduce_mean(d_loss_real + d_loss_fake)
    g_loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(logits=d_fake, labels=tf.ones_like(d_fake)))
    d_vars = tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES, scope="discriminator")
    g_vars = tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES, scope="generator")
    d_train = tf1.train.AdamOptimizer(0.001, beta1=0.5).minimize(d_loss, var_list=d_vars)
    g_train = tf1.train.AdamOptimizer(0.001, beta1=0.5).minimize(g_loss, var_list=g_vars)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            noise = rng.uniform(-1.0, 1.0, (64, NOISE)).astype(np.float32)
            _, d_value = sess.run([d_train, d_loss], feed_dict={real: real_samples(rng, 64), z: noise})
            noise = rng.uniform(-1.0, 1.0, (64, NOISE)).astype(np.float32)
            _, g_value = sess.run([g_train, g_loss], feed_dict={z: noise})
            losses.append(d_value + g_value)
            if step % 40 == 0:
                print("step %d d_loss %.4f g_loss %.4f" % (step, d_value, g_value))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
