"""The compiled ops: ``UnscaleAndCheckFinite`` (multiply gradients by 1/scale and test them for
inf/nan) and ``RoundToHalf`` (round float32 values to half).

Entry point: ``op.unscale_and_check_finite(grads, inv_scale) -> (unscaled, all_finite)``:
one compiled op per device when the library loads, otherwise composite TensorFlow ops with
identical results (``op.fused_op_available()`` tells which); ``portable=True`` builds the
composite as marked groups that ``fusable.fuse_unscale_groups`` turns into the op in a
GraphDef (what rewriting sessions run).  ``round_to_half`` is the
library's second op, ``RoundToHalf`` (float32 rounded to float16/bfloat16 in one pass, CPU
only), with the Cast pair as its fallback.  ``build`` compiles the C++/CUDA
sources in ``custom_ops/`` against the installed TensorFlow (``python -m
tfamp_rewrite.fused_op.build``, what ``make op`` runs), finding nvcc with ``cuda_toolchain``.

May import: the shared basics only.  Nothing about graphs, training or files.
"""
