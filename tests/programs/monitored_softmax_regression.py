"""Softmax regression under ``MonitoredTrainingSession``: the TF1 hooks pattern.

A linear softmax classifier (``tf.compat.v1.get_variable`` weights, zero-initialised)
trained by ``GradientDescentOptimizer`` inside
``tf.compat.v1.train.MonitoredTrainingSession`` with a ``StopAtStepHook`` and a custom
``SessionRunHook`` whose ``before_run`` / ``after_run`` collect the loss of every step
(``SessionRunArgs``).  No checkpoint directory.  The data is made here: 20 features,
four Gaussian classes that overlap.
"""
import argparse
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the batches
FEATURES, CLASSES = 20, 4


def make_data(seed, count=2000):
    rng = np.random.RandomState(seed)
    means = rng.normal(0.0, 1.0, (CLASSES, FEATURES))
    labels = rng.randint(0, CLASSES, count)
    inputs = means[labels] + rng.normal(0.0, 3.0, (count, FEATURES))
    return inputs.astype(np.float32), labels.astype(np.int64)


class LossHistoryHook(tf1.train.SessionRunHook):
    """Fetches ``loss`` alongside every training step and keeps its values."""

    def __init__(self, loss):
        self.loss = loss
        self.values = []

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self.loss)

    def after_run(self, run_context, run_values):
        self.values.append(run_values.results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    random.seed(args.seed)
    tf1.set_random_seed(args.seed)
    inputs, targets = make_data(DATA_SEED)

    x = tf1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = tf1.placeholder(tf.int64, [None], name="y")
    w = tf1.get_variable("weights", [FEATURES, CLASSES], initializer=tf1.zeros_initializer())
    b = tf1.get_variable("bias", [CLASSES], initializer=tf1.zeros_initializer())
    logits = tf.matmul(x, w) + b
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    global_step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)

    history = LossHistoryHook(loss)
    hooks = [tf1.train.StopAtStepHook(last_step=args.steps), history]
    rng = np.random.RandomState(args.seed)
    with tf1.train.MonitoredTrainingSession(hooks=hooks, save_summaries_steps=None,
                                            save_checkpoint_secs=None, log_step_count_steps=None) as sess:
        while not sess.should_stop():
            batch = rng.randint(0, len(targets), 128)
            _, step = sess.run([train_op, global_step], feed_dict={x: inputs[batch], y: targets[batch]})
            if step % 50 == 0:
                print("step %d loss %.4f" % (step, history.values[-1]))
    print("final loss: %.6f" % np.mean(history.values[-10:]))


if __name__ == "__main__":
    main()
