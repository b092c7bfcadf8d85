"""A TF1 training script that knows nothing of tfamp_rewrite (used by test_zero_code_change).

It trains a small model with a plain tf.compat.v1.Session and prints one JSON line saying
what happened: whether a MatMul that overflows only in float16 returned inf, which
loss-scale variables exist, the session's class, the loss before and after training.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

x = tf1.placeholder(tf.float32, [16, 8], name="x")
y = tf1.placeholder(tf.float32, [16, 1], name="y")
hidden = tf1.layers.dense(x, 16, tf.nn.relu)
loss = tf.reduce_mean(tf.square(tf1.layers.dense(hidden, 1) - y))
step = tf1.train.get_or_create_global_step()
train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=step)
big = tf.constant(np.full([1, 4], 2.0 ** 10, np.float32))
probe = tf.matmul(big, tf.transpose(big))  # 4 * 2**20: finite in float32, inf in float16

rng = np.random.default_rng(0)
feed = {x: rng.standard_normal((16, 8)).astype(np.float32)}
feed[y] = feed[x].sum(axis=1, keepdims=True)
with tf1.Session() as session:
    session.run(tf1.global_variables_initializer())
    first = float(session.run(loss, feed))
    for _ in range(30):
        session.run(train, feed)
    result = {
        "probe_is_inf": bool(np.isinf(session.run(probe)).all()),
        "loss_scale_variables": sorted(v.op.name for v in tf1.global_variables()
                                       if "loss_scale" in v.op.name),
        "session_class": type(session).__module__ + "." + type(session).__name__,
        "first_loss": first,
        "last_loss": float(session.run(loss, feed)),
        "argv": sys.argv[1:],
    }
print("RESULT " + json.dumps(result))
