"""What mixed precision a process got: one case of the activation matrix (test_activation_matrix).

    python activation_probe.py ORDER      ORDER: tensorflow_first | tfamp_rewrite_first |
                                                 tensorflow_only | child (the same probe in a
                                                 child process, tensorflow_only, its result)

Imports TensorFlow and tfamp_rewrite in ORDER (``tfamp_rewrite.Session`` is touched, which
imports the training modules: the path that once met the start-up hook half-way), then
prints one ``RESULT {json}`` line:

* ``probe_is_inf``: a MatMul of 2**10-valued rows, 4 * 2**20, fetched through a plain
  ``tf.compat.v1.Session``: inf only when it ran in float16 (the graph rewrite is on);
* ``loss_scale_variables``: the loss-scale variables a plain MomentumOptimizer created;
* ``skipped_inf_step``: a step whose gradient is inf left the weight unchanged and halved
  the loss scale (loss scaling is on) -- without loss scaling the weight becomes non-finite;
* ``session_class``: what ``tf.compat.v1.Session()`` constructed.
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ORDER = sys.argv[1]

if ORDER == "child":
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "tensorflow_only"],
                          stdout=subprocess.PIPE, text=True, check=True)
    print(next(line for line in done.stdout.splitlines() if line.startswith("RESULT ")))
    sys.exit(0)
if ORDER == "tensorflow_first":
    import tensorflow as tf

    import tfamp_rewrite

    assert tfamp_rewrite.Session
elif ORDER == "tfamp_rewrite_first":
    import tfamp_rewrite

    assert tfamp_rewrite.Session
    import tensorflow as tf
elif ORDER == "tensorflow_only":
    import tensorflow as tf
else:
    sys.exit("unknown ORDER %r" % ORDER)

import numpy as np  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
big = tf.constant(np.full([1, 4], 2.0 ** 10, np.float32))
probe = tf.matmul(big, tf.transpose(big))
x = tf1.placeholder(tf.float32, [], name="x")
w = tf1.get_variable("w", [], initializer=tf1.ones_initializer())
train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(w * x)
scales = [v for v in tf1.global_variables() if v.op.name.startswith("loss_scale/")]
with tf1.Session() as session:
    session.run(tf1.global_variables_initializer())
    probe_value = session.run(probe)
    scale_before = [session.run(v) for v in scales if v.op.name.endswith("current_loss_scale")]
    session.run(train, {x: np.inf})
    weight = session.run(w)
    scale_after = [session.run(v) for v in scales if v.op.name.endswith("current_loss_scale")]
    result = {
        "probe_is_inf": bool(np.isinf(probe_value).all()),
        "loss_scale_variables": sorted(v.op.name for v in scales),
        "skipped_inf_step": bool(weight == 1.0 and scale_after and scale_after[0] == scale_before[0] / 2),
        "weight_after_inf_step_finite": bool(np.isfinite(weight)),
        "session_class": type(session).__module__ + "." + type(session).__name__,
        "tfamp_rewrite_imported": "tfamp_rewrite" in sys.modules,
    }
print("RESULT " + json.dumps(result))
