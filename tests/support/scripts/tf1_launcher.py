"""``python tf1_launcher.py SCRIPT ARGS...``: runs SCRIPT as ``python SCRIPT ARGS...`` would,
after ``tf.compat.v1.disable_v2_behavior()`` (TF1 behaviour; see tests/support/tf1_behavior.py)."""
import os
import runpy
import sys

import tensorflow as tf

tf.compat.v1.disable_v2_behavior()
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
