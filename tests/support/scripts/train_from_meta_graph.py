"""A TF1 script that continues training from the MetaGraph a checkpoint was saved with.

``train_from_meta_graph.py CHECKPOINT_DIR STEPS`` imports the newest checkpoint's ``.meta``
(``tf.train.import_meta_graph``, as TF1 inference and fine-tuning scripts do), restores the
checkpoint, runs the graph's TRAIN_OP STEPS times and prints one JSON line: whether
tfamp_rewrite's ``UnscaleAndCheckFinite`` op is registered in this process (it is not: an
import of a graph holding it would have failed), and the global
step and loss scale before and after.  It knows nothing of tfamp_rewrite (used by
test_saved_training_graph).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_v2_behavior()

checkpoint_dir, steps = sys.argv[1], int(sys.argv[2])
checkpoint = tf1.train.latest_checkpoint(checkpoint_dir)
saver = tf1.train.import_meta_graph(checkpoint + ".meta")
(train_op,) = tf1.get_collection(tf1.GraphKeys.TRAIN_OP)
step = tf1.train.get_global_step()
scales = [v for v in tf1.global_variables() if v.op.name.endswith("current_loss_scale")]
from tensorflow.python.framework import op_def_registry  # noqa: E402

look_up = getattr(op_def_registry, "get", None)  # TensorFlow 2.x; 1.15 lists them
registered = (look_up("UnscaleAndCheckFinite") is not None if look_up
              else "UnscaleAndCheckFinite" in op_def_registry.get_registered_ops())

with tf1.Session() as session:
    saver.restore(session, checkpoint)
    before = session.run([step] + scales)
    for _ in range(steps):
        session.run(train_op)
    after = session.run([step] + scales)
print("RESULT " + json.dumps({
    "op_registered": registered,
    "steps": [int(before[0]), int(after[0])],
    "loss_scales": [float(before[1]), float(after[1])] if scales else None,
}))
