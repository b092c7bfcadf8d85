"""A variational autoencoder: the TF1 VAE tutorial pattern (Kingma & Welling on binary data).

Encoder and decoder MLPs with softplus units, the reparameterisation
``z = mu + sqrt(exp(log_sigma_sq)) * eps``, the KL term in closed form, and the
reconstruction loss written the classic tutorial way,
``-tf.reduce_sum(x * tf.log(1e-10 + p) + (1 - x) * tf.log(1e-10 + 1 - p), 1)`` with
``p = tf.sigmoid(logits)``; ``AdamOptimizer``.  The data is made here: 8x8 binary images,
noisy copies of ten random prototypes.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches

PIXELS, LATENT = 64, 4


def make_data(seed, count=2000):
    rng = np.random.RandomState(seed)
    prototypes = rng.uniform(size=(10, PIXELS)) < 0.4
    images = prototypes[rng.randint(0, 10, count)]
    flips = rng.uniform(size=images.shape) < 0.05
    return np.logical_xor(images, flips).astype(np.float32)


def mlp(x, sizes, name):
    with tf1.variable_scope(name):
        for index, size in enumerate(sizes[:-1]):
            x = tf1.layers.dense(x, size, activation=tf.nn.softplus, name="layer%d" % index)
        return x


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    data = make_data(DATA_SEED)

    x = tf1.placeholder(tf.float32, [None, PIXELS], name="x")
    hidden = mlp(x, [128, 128, None], "encoder")
    z_mean = tf1.layers.dense(hidden, LATENT, name="z_mean")
    z_log_sigma_sq = tf1.layers.dense(hidden, LATENT, name="z_log_sigma_sq")
    eps = tf1.random_normal(tf.shape(z_mean), 0.0, 1.0, dtype=tf.float32)
    z = z_mean + tf.sqrt(tf.exp(z_log_sigma_sq)) * eps
    logits = tf1.layers.dense(mlp(z, [128, 128, None], "decoder"), PIXELS, name="x_logits")
    p = tf.sigmoid(logits)
    reconstr_loss = -tf.reduce_sum(x * tf1.log(1e-10 + p) + (1 - x) * tf1.log(1e-10 + 1 - p), 1)
    latent_loss = -0.5 * tf.reduce_sum(1 + z_log_sigma_sq - tf.square(z_mean) - tf.exp(z_log_sigma_sq), 1)
    cost = tf.reduce_mean(reconstr_loss + latent_loss)
    train_op = tf1.train.AdamOptimizer(0.003).minimize(cost)

    rng = np.random.RandomState(args.seed)
    losses = []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            _, cost_value = sess.run([train_op, cost], feed_dict={x: data[rng.randint(0, len(data), 64)]})
            losses.append(cost_value)
            if step % 100 == 0:
                print("step %d loss %.4f" % (step, cost_value))
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
