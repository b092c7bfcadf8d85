"""A TF1 script that trains with MonitoredTrainingSession and resumes from its checkpoints.

``resume_training.py CHECKPOINT_DIR LAST_STEP`` trains until the global step reaches
LAST_STEP, restoring the newest checkpoint in CHECKPOINT_DIR first and saving one at the end,
and prints one JSON line: the global step it started and finished at, and the loss scale
(null without one).  It knows nothing of tfamp_rewrite (used by test_checkpoint_restore).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_v2_behavior()

checkpoint_dir, last_step = sys.argv[1], int(sys.argv[2])
rng = np.random.RandomState(0)
features = tf.constant(rng.standard_normal((32, 8)).astype(np.float32))
targets = tf.reduce_sum(features, axis=1, keepdims=True)
hidden = tf1.layers.dense(features, 16, tf.nn.relu)
loss = tf.reduce_mean(tf.square(tf1.layers.dense(hidden, 1) - targets))
step = tf1.train.get_or_create_global_step()
train = tf1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
scales = [v for v in tf1.global_variables() if v.op.name.endswith("current_loss_scale")]

hooks = [tf1.train.StopAtStepHook(last_step=last_step)]
with tf1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,
                                        save_summaries_steps=None) as session:
    started_at = int(session.run(step))
    scale = float(session.run(scales[0])) if scales else None
    while not session.should_stop():
        session.run(train)
finished_at = int(tf1.train.load_variable(checkpoint_dir, "global_step"))
print("RESULT " + json.dumps({"started_at": started_at, "finished_at": finished_at, "loss_scale": scale}))
