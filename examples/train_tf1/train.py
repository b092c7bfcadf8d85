"""A plain TF1 training script: a tf.compat.v1.layers conv net on scikit-learn's digits.

Written the way TF1 users write them -- graph, optimizer, Session, loop -- with mixed
precision as the one optional line::

    python examples/train_tf1/train.py            # float32
    python examples/train_tf1/train.py --amp      # + tfamp_rewrite.enable_mixed_precision_graph_rewrite
    TF_ENABLE_AUTO_MIXED_PRECISION=1 python examples/train_tf1/train.py   # no code change at all
    tfamp-run examples/train_tf1/train.py          # the same, through the launcher
    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tf1/train.py --horovod --amp

With ``--horovod`` it is a data-parallel Horovod script: each rank trains on its shard of
the data with ``hvd.DistributedOptimizer`` around the (loss-scaled) optimizer, the learning
rate scaled by the number of ranks, rank 0's initial variables broadcast to the others,
and only rank 0 prints.

On a machine without a Tensor Core GPU set TFAMP_REWRITE_TARGET=cpu to rewrite anyway, and
TFAMP_REWRITE_NUMERICS=emulate to compute as a Tensor Core GPU does (float32 kernels on values
rounded to float16, about float32 speed) rather than on the CPU's slow float16 kernels.
Prints progress (steps/s, loss, loss scale) and the final test accuracy; ``--json FILE``
also writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

tf1 = tf.compat.v1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amp", action="store_true",
                        help="wrap the optimizer with tfamp_rewrite.enable_mixed_precision_graph_rewrite")
    parser.add_argument("--horovod", action="store_true",
                        help="train data-parallel on the Horovod ranks (run under horovodrun)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--learning-rate", type=float, default=0.05, help="for one rank")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this JSON file")
    return parser.parse_args(argv)


def load_data(seed):
    """Digits scaled to [0, 1], 8x8x1 images; a fixed 80/20 train/test split."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(labels))
    split = int(0.8 * len(labels))
    return (images[order[:split]], labels[order[:split]]), (images[order[split:]], labels[order[split:]])


def build_model(images):
    net = tf1.layers.conv2d(images, 8, 3, padding="same", activation=tf.nn.relu, name="conv1")
    net = tf1.layers.conv2d(net, 16, 3, padding="same", activation=tf.nn.relu, name="conv2")
    net = tf1.layers.max_pooling2d(net, 2, 2)
    net = tf1.layers.dense(tf1.layers.flatten(net), 64, activation=tf.nn.relu, name="hidden")
    return tf1.layers.dense(net, 10, name="logits")


def main(argv=None):
    args = parse_args(argv)
    rank, ranks = 0, 1
    if args.horovod:
        import horovod.tensorflow as hvd

        hvd.init()
        rank, ranks = hvd.rank(), hvd.size()
    log = print if rank == 0 else (lambda *_, **__: None)
    (train_x, train_y), (test_x, test_y) = load_data(args.seed)
    train_x, train_y = train_x[rank::ranks], train_y[rank::ranks]  # this rank's shard
    if args.horovod:
        log("horovod: %d ranks, %d training images each, learning rate %g" % (
            ranks, len(train_y), args.learning_rate * ranks))
    tf1.disable_eager_execution()
    tf1.set_random_seed(args.seed)
    # On TF 2.x tf.compat.v1.layers take their initializers from Keras 2, which draws their
    # seeds from Python's random module: seed it too, so --seed fixes the initial weights.
    random.seed(args.seed)
    images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    logits = build_model(images)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
    global_step = tf1.train.get_or_create_global_step()
    # Each step averages the gradients of `ranks` batches: scale the learning rate with it.
    optimizer = tf1.train.MomentumOptimizer(args.learning_rate * ranks, 0.9)
    if args.amp:
        import tfamp_rewrite

        optimizer = tfamp_rewrite.enable_mixed_precision_graph_rewrite(optimizer)
    if args.horovod:
        optimizer = hvd.DistributedOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=global_step)
    # After minimize, so that the slots and the loss scale are broadcast too.
    broadcast = hvd.broadcast_global_variables(0) if args.horovod else tf.no_op()
    loss_scales = [v for v in tf1.global_variables() if "current_loss_scale" in v.name]

    rng = np.random.default_rng(args.seed)
    history = []
    with tf1.Session() as session:
        session.run(tf1.global_variables_initializer())
        session.run(broadcast)
        start = time.time()
        for step in range(1, args.steps + 1):
            batch = rng.integers(0, len(train_y), args.batch_size)
            fetches = [train_op, loss] + loss_scales
            step_start = time.perf_counter()
            _, loss_value, *scale = session.run(fetches, {images: train_x[batch], labels: train_y[batch]})
            history.append({"step": step, "loss": float(loss_value),
                            "seconds": time.perf_counter() - step_start,
                            "loss_scale": float(scale[0]) if scale else None})
            if step % args.log_every == 0 or step == args.steps:
                rate = step / (time.time() - start)
                log("step %5d  %7.1f steps/s  loss %.4f  loss scale %s" % (
                    step, rate, loss_value, "%g" % scale[0] if scale else "-"), flush=True)
        test_accuracy = float(session.run(accuracy, {images: test_x, labels: test_y}))
        seconds = time.time() - start
    log("final test accuracy %.4f (%d steps, %.1f s)" % (test_accuracy, args.steps, seconds))
    result = {"test_accuracy": test_accuracy, "steps": args.steps, "seconds": seconds,
              "loss_scale_variables": [v.name for v in loss_scales], "history": history}
    if args.json and rank == 0:
        with open(args.json, "w") as handle:
            json.dump(result, handle)
    return result


if __name__ == "__main__":
    main()
