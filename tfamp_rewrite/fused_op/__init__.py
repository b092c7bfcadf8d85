"""The fused ``UnscaleAndCheckFinite`` op: multiply gradients by 1/scale and test them for inf/nan.

Entry point: ``op.unscale_and_check_finite(grads, inv_scale) -> (unscaled, all_finite)``:
one compiled op per device when the library loads, otherwise composite TensorFlow ops with
identical results (``op.fused_op_available()`` tells which).  ``build`` compiles the C++/CUDA
sources in ``custom_ops/`` against the installed TensorFlow (``python -m
tfamp_rewrite.fused_op.build``, what ``make op`` runs), finding nvcc with ``cuda_toolchain``.

May import: the shared basics only.  Nothing about graphs, training or files.
"""
