"""A custom Estimator: the TF1 ``model_fn`` + ``numpy_input_fn`` tutorial pattern.

``tf.compat.v1.estimator.Estimator`` with a ``model_fn`` (dense layers on the ``features``
dict, an ``EstimatorSpec`` per mode, ``minimize`` with the global step), trained with
``tf.compat.v1.estimator.inputs.numpy_input_fn`` (queue-fed, one thread, no shuffling) in a
temporary ``model_dir``; the final loss is ``estimator.evaluate`` 's loss on the training
data.  The data is made here: a noisy nonlinear regression on 10 features.
"""
import argparse
import random
import shutil
import tempfile

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

DATA_SEED = 1234  # the data set is fixed: --seed varies the initial weights and the batches


def make_data(seed, count=1024, features=10):
    rng = np.random.RandomState(seed)
    x = rng.normal(0.0, 1.0, (count, features)).astype(np.float32)
    w = rng.normal(0.0, 1.0, (features, 1))
    y = np.sin(x.dot(w)) + 0.5 * x[:, :1] * x[:, 1:2] + rng.normal(0.0, 0.3, (count, 1))
    return x, y.astype(np.float32)


def model_fn(features, labels, mode, params):
    net = features["x"]
    for index, units in enumerate(params["hidden_units"]):
        net = tf1.layers.dense(net, units, activation=tf.nn.relu, name="hidden%d" % index)
    predictions = tf1.layers.dense(net, 1, name="prediction")
    if mode == tf1.estimator.ModeKeys.PREDICT:
        return tf1.estimator.EstimatorSpec(mode, predictions={"y": predictions})
    loss = tf1.losses.mean_squared_error(labels, predictions)
    if mode == tf1.estimator.ModeKeys.EVAL:
        metrics = {"rmse": tf1.metrics.root_mean_squared_error(labels, predictions)}
        return tf1.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    optimizer = tf1.train.AdagradOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    random.seed(args.seed)
    x, y = make_data(DATA_SEED)
    model_dir = tempfile.mkdtemp(prefix="estimator_dnn_")
    try:
        config = tf1.estimator.RunConfig(model_dir=model_dir, tf_random_seed=args.seed,
                                         save_checkpoints_steps=10 ** 6, keep_checkpoint_max=1,
                                         save_summary_steps=10 ** 6, log_step_count_steps=100)
        estimator = tf1.estimator.Estimator(model_fn=model_fn, config=config,
                                            params={"hidden_units": [64, 64], "learning_rate": 0.1})
        train_input = tf1.estimator.inputs.numpy_input_fn(
            x={"x": x}, y=y, batch_size=32, num_epochs=None, shuffle=False)
        estimator.train(train_input, steps=args.steps)
        eval_input = tf1.estimator.inputs.numpy_input_fn(
            x={"x": x}, y=y, batch_size=256, num_epochs=1, shuffle=False)
        metrics = estimator.evaluate(eval_input)
        print("evaluation: %s" % sorted(metrics.items()))
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    print("final loss: %.6f" % metrics["loss"])


if __name__ == "__main__":
    main()
