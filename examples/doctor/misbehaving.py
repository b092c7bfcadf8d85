"""A TF1 training script made to misbehave in float16, for the precision doctor to find out.

A two-layer classifier on synthetic data (a random teacher labels Gaussian inputs), with
one of two classic mistakes planted::

    --problem overflow    unnormalised inputs (values up to ~250) and an unnormalised
                          sum-of-squares penalty on the hidden pre-activations: the square
                          (a Mul between two MatMuls, so half under every TensorFlow's
                          rules) exceeds 65504
    --problem underflow   the loss multiplied by 1e-5 (the learning rate by 1e5): its
                          gradients fall below float16's 2**-24 and flush to zero unscaled
    --problem none        neither

Run it plainly (float32), in mixed precision (``--amp``: ``LossScaleOptimizer`` with
``--loss-scale``, ``dynamic`` by default, and the rewrite), or under the doctor::

    python examples/doctor/misbehaving.py --problem underflow
    tfamp-rewrite doctor --steps 10 --plot gradients.png examples/doctor/misbehaving.py --problem underflow

``build(problem, ...)`` and ``train(...)`` are importable (the tests train it in float32
and in emulated float16 at the loss scale the doctor recommends).
"""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
PROBLEMS = ("none", "overflow", "underflow")
FEATURES, HIDDEN, CLASSES = 32, 64, 10
UNDERFLOW_FACTOR = 1e-5


def make_data(problem: str, count: int = 2048, seed: int = 0):
    """Inputs and teacher labels; ``overflow`` leaves the inputs unnormalised (x * 64 + 128)."""
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((count, FEATURES)).astype(np.float32)
    teacher = np.random.default_rng(1000).standard_normal((FEATURES, CLASSES)).astype(np.float32)
    labels = np.argmax(inputs @ teacher, axis=1).astype(np.int32)
    if problem == "overflow":
        inputs = inputs * 64.0 + 128.0
    return inputs, labels


def _dense(inputs, units: int, name: str, seed: int):
    kernel = tf1.get_variable(name + "/kernel", [int(inputs.shape[-1]), units],
                              initializer=tf1.initializers.glorot_uniform(seed=seed))
    bias = tf1.get_variable(name + "/bias", [units], initializer=tf1.zeros_initializer())
    product = tf.linalg.matmul(inputs, kernel, name=name + "/MatMul")
    return tf.nn.bias_add(product, bias, name=name + "/BiasAdd")


def build(problem: str, learning_rate: float = 0.5, amp: bool = False, loss_scale="dynamic", seed: int = 0):
    """The graph of one training step, in the default graph: a dict of its tensors."""
    if problem not in PROBLEMS:
        raise ValueError("problem %r is not one of %s" % (problem, ", ".join(PROBLEMS)))
    tf1.set_random_seed(seed)
    inputs = tf1.placeholder(tf.float32, [None, FEATURES], name="inputs")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    pre = _dense(inputs, HIDDEN, "hidden", seed)  # MatMul + BiasAdd: half under AMP
    logits = _dense(tf.nn.relu(pre), CLASSES, "logits", seed + 1)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    if problem == "overflow":
        squares = tf.multiply(pre, pre, name="sum_of_squares/square")   # > 65504 in float16
        # Summed per row by a MatMul, as a batched penalty often is: the square then sits
        # between two allow ops, so it is half under TF 1.15's rules too (not only where
        # infer-after-allow paints a Mul that merely follows a MatMul).  The sums stay
        # within float16's range; only the square overflows.
        scaled = tf.multiply(squares, 2.0 ** -10, name="sum_of_squares/scaled")  # within range
        per_row = tf.linalg.matmul(scaled, tf.ones([HIDDEN, 1]), name="sum_of_squares/per_row")
        loss = loss + 1e-6 * tf.reduce_sum(per_row, name="sum_of_squares")
        learning_rate = learning_rate * 1e-3
    if problem == "underflow":
        loss = tf.multiply(loss, UNDERFLOW_FACTOR, name="tiny_loss")     # gradients below 2**-24
        learning_rate = learning_rate / UNDERFLOW_FACTOR
    optimizer = tf1.train.GradientDescentOptimizer(learning_rate)
    if amp:
        import tfamp_rewrite

        optimizer = tfamp_rewrite.LossScaleOptimizer(optimizer, loss_scale)
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_or_create_global_step())
    correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
    return {"inputs": inputs, "labels": labels, "loss": loss, "train_op": train_op,
            "accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}


def train(problem: str, steps: int, batch_size: int = 64, amp: bool = False, loss_scale="dynamic",
          seed: int = 0, session_factory=None, log_every: int = 0):
    """Trains ``steps`` steps from ``seed``; returns the per-step losses and the final accuracy.

    ``session_factory(graph)`` makes the session (default ``tf.compat.v1.Session``; the
    tests pass ``tfamp_rewrite.Session`` with emulated numerics for the half runs).
    """
    inputs, labels = make_data(problem, seed=seed)
    graph = tf.Graph()
    with graph.as_default():
        parts = build(problem, amp=amp, loss_scale=loss_scale, seed=seed)
        session = (session_factory or (lambda g: tf1.Session(graph=g)))(graph)
        with session:
            session.run(tf1.global_variables_initializer())
            rng = np.random.default_rng(seed)
            losses = []
            for step in range(1, steps + 1):
                batch = rng.integers(0, len(labels), batch_size)
                feed = {parts["inputs"]: inputs[batch], parts["labels"]: labels[batch]}
                _, loss = session.run([parts["train_op"], parts["loss"]], feed)
                losses.append(float(loss))
                if log_every and (step % log_every == 0 or step == steps):
                    print("step %4d  loss %.6g" % (step, loss), flush=True)
            everything = {parts["inputs"]: inputs, parts["labels"]: labels}
            accuracy = float(session.run(parts["accuracy"], everything))
    return {"losses": losses, "accuracy": accuracy}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=PROBLEMS, default="underflow")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--amp", action="store_true",
                        help="LossScaleOptimizer and the mixed-precision rewrite")
    parser.add_argument("--loss-scale", default="dynamic", help="'dynamic' or a number (with --amp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    tf1.disable_eager_execution()
    scale = args.loss_scale if args.loss_scale == "dynamic" else float(args.loss_scale)
    factory = None
    if args.amp:
        import tfamp_rewrite

        factory = lambda graph: tfamp_rewrite.Session(graph=graph)  # noqa: E731
    result = train(args.problem, args.steps, args.batch_size, args.amp, scale, args.seed, factory,
                   log_every=max(1, args.steps // 10))
    print("final accuracy %.4f" % result["accuracy"])
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle)
    return result


if __name__ == "__main__":
    main()
