"""How closely TensorFlow 1.15 and 2.x must agree when they run the same graph, and why.

Both run with Grappler off and Eigen kernels (2.x without oneDNN, see tf2_runtime.py).
Differences are the largest absolute difference relative to the output's largest magnitude.

* ``TIGHT``: float32 graphs, and graphs with emulated half precision (float32 kernels and
  Casts only), agree to float32 rounding: MatMul, Conv2D, loops and functions give
  bit-identical float32 results in both.
* ``FLIPS``: except batch norm, whose float32 kernels differ in the last bit between the
  two (measured: ResNet-50's first Conv2D output is bit-identical, the FusedBatchNormV3
  after it differs by 1.2e-7). Where such a difference moves a value across a half
  rounding boundary, an emulated graph's value differs by one half ulp (2^-11 = 4.9e-4
  relative), which later layers carry on: measured up to 1e-3 on ResNet-50's logits;
  ``FLIPS`` allows about ten half ulps.
* ``HALF``: native half graphs run each runtime's own CPU half kernels, which round and
  accumulate differently (measured up to 5e-3 on ResNet-50's logits); the same holds
  for every half graph after training steps, whose gradient reductions differ in float32.
* ``TRAINED_FLOAT32``: float32 graphs after training steps accumulate last-bit differences.
"""
from __future__ import annotations

import numpy as np

TIGHT = 1e-5
FLIPS = 5e-3
HALF = 2e-2
TRAINED_FLOAT32 = 1e-4
_BATCH_NORM = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


def relative_difference(actual, expected) -> float:
    """max |actual - expected| / max |expected| (0 for empty outputs)."""
    expected = np.asarray(expected, np.float64)
    if not expected.size:
        return 0.0
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    return float(np.max(np.abs(np.asarray(actual, np.float64) - expected))) / scale


def forward_bound(graph_def, numerics: str) -> float:
    """The bound for a graph's outputs; ``numerics``: "float32", "native" or "emulate"."""
    if numerics == "native":
        return HALF
    if numerics == "emulate" and any(node.op in _BATCH_NORM for node in graph_def.node):
        return FLIPS
    return TIGHT


def trained_bound(numerics: str) -> float:
    """The bound for outputs after training steps."""
    return TRAINED_FLOAT32 if numerics == "float32" else HALF
