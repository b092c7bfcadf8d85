"""Test-wide settings: quiet TensorFlow, and TensorFlow's own AMP pass as a real fp16 rewrite."""
import os
import sys

# Read by TensorFlow at import / rewrite time, so set before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"] = "0"

sys.path.insert(0, os.path.dirname(__file__))
