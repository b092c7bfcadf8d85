"""A small ResNet fed by queue runners: the TF1 CIFAR-10 input-pipeline + batch-norm pattern.

Input: ``tf.compat.v1.train.slice_input_producer`` over in-memory arrays (no shuffling) into
``tf.compat.v1.train.batch`` (one thread), run by ``tf.compat.v1.train.start_queue_runners``
under a ``tf.compat.v1.train.Coordinator``.  Model: a 3x3 conv stem and three residual blocks
of ``tf.compat.v1.layers.conv2d`` + ``tf.compat.v1.layers.batch_normalization(training=...)``
(a strided projection shortcut where the shape changes), global average pooling, a dense
softmax layer; the train op depends on the ``UPDATE_OPS`` collection (the moving averages).
``MomentumOptimizer``.  The images are made here: 16x16x3 noisy class templates, 20% of the labels
redrawn at random.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches
CLASSES = 5


def make_data(seed, count=1024, size=16):
    rng = np.random.RandomState(seed)
    templates = rng.uniform(-1.0, 1.0, (CLASSES, size, size, 3))
    labels = rng.randint(0, CLASSES, count)
    images = templates[labels] + rng.normal(0.0, 1.5, (count, size, size, 3))
    noisy = rng.uniform(size=count) < 0.2  # label noise: the loss has a floor well above 0
    labels[noisy] = rng.randint(0, CLASSES, noisy.sum())
    return images.astype(np.float32), labels.astype(np.int32)


def residual_block(x, filters, stride, training, name):
    with tf1.variable_scope(name):
        shortcut = x
        if stride != 1 or x.shape[-1] != filters:
            shortcut = tf1.layers.conv2d(x, filters, 1, strides=stride, use_bias=False, name="projection")
            shortcut = tf1.layers.batch_normalization(shortcut, training=training, name="projection_bn")
        net = tf1.layers.conv2d(x, filters, 3, strides=stride, padding="same", use_bias=False, name="conv1")
        net = tf.nn.relu(tf1.layers.batch_normalization(net, training=training, name="bn1"))
        net = tf1.layers.conv2d(net, filters, 3, padding="same", use_bias=False, name="conv2")
        net = tf1.layers.batch_normalization(net, training=training, name="bn2")
        return tf.nn.relu(net + shortcut)


def inference(images, training):
    net = tf1.layers.conv2d(images, 16, 3, padding="same", use_bias=False, name="stem")
    net = tf.nn.relu(tf1.layers.batch_normalization(net, training=training, name="stem_bn"))
    net = residual_block(net, 16, 1, training, "block1")
    net = residual_block(net, 32, 2, training, "block2")
    net = residual_block(net, 32, 1, training, "block3")
    net = tf.reduce_mean(net, axis=[1, 2])
    return tf1.layers.dense(net, CLASSES, name="logits")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    images, labels = make_data(DATA_SEED)
    # --seed picks where in the (fixed-order) data set the queue starts.
    start = np.random.RandomState(args.seed).randint(0, len(labels))
    images, labels = np.roll(images, -start, axis=0), np.roll(labels, -start, axis=0)

    image, label = tf1.train.slice_input_producer([tf.constant(images), tf.constant(labels)], shuffle=False)
    image_batch, label_batch = tf1.train.batch([image, label], batch_size=32, num_threads=1, capacity=128)
    logits = inference(image_batch, training=True)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels=label_batch, logits=logits)
    global_step = tf1.train.get_or_create_global_step()
    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        train_op = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=global_step)

    losses = []
    with tf1.Session() as sess:
        sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
        coord = tf1.train.Coordinator()
        threads = tf1.train.start_queue_runners(sess=sess, coord=coord)
        try:
            for step in range(args.steps):
                if coord.should_stop():
                    break
                _, loss_value = sess.run([train_op, loss])
                losses.append(loss_value)
                if step % 20 == 0:
                    print("step %d loss %.4f" % (step, loss_value))
        finally:
            coord.request_stop()
            coord.join(threads)
    print("final loss: %.6f" % np.mean(losses[-10:]))


if __name__ == "__main__":
    main()
