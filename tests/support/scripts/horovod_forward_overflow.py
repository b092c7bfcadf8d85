"""A TF1 Horovod program whose forward pass overflows float16 on rank 0 only.

``horovod_forward_overflow.py STEPS`` trains STEPS runs under MonitoredTrainingSession with
``hvd.DistributedOptimizer`` and ``BroadcastGlobalVariablesHook``, and prints one JSON line:
this rank, the runs it made and the global step it ended at.  Rank 0's inputs are large
enough that its logits overflow float16; rank 1's are not.  It knows nothing of
tfamp_rewrite (used by test_horovod_heal).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_v2_behavior()
hvd.init()
tf1.set_random_seed(0)
steps = int(sys.argv[1])
rng = np.random.RandomState(hvd.rank())
x = rng.randn(32, 8).astype(np.float32) * (3000.0 if hvd.rank() == 0 else 1.0)
y = (x[:, 0] > 0).astype(np.int32)
initializer = tf1.random_normal_initializer(stddev=1.0)
hidden = tf1.layers.dense(tf.constant(x), 64, tf.nn.relu, kernel_initializer=initializer)
logits = tf1.layers.dense(hidden, 2, kernel_initializer=initializer)
loss = tf1.losses.sparse_softmax_cross_entropy(tf.constant(y), logits)
global_step = tf1.train.get_or_create_global_step()
train = hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(1e-7)).minimize(loss, global_step)
runs = 0
with tf1.train.MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as session:
    for _ in range(steps):
        session.run(train)
        runs += 1
    final_step = int(session.run(global_step))
print(json.dumps({"rank": hvd.rank(), "runs": runs, "global_step": final_step}))
