"""Mixed-precision training: sessions that run the rewritten graph, and dynamic loss scaling.

Entry point: ``enable.enable_mixed_precision_graph_rewrite(opt)`` -- it wraps ``opt`` in a
``loss_scale_optimizer.LossScaleOptimizer`` (state and update rule: ``loss_scale``) and
turns on the process-wide switch (``activation``) that makes ``tf.compat.v1.Session`` and
what builds on it construct ``session.Session``, which runs a rewritten copy of the user's
graph (``shadow_graph``) on the devices ``devices`` allows.  ``TF_ENABLE_AUTO_MIXED_PRECISION``
reaches the same switch through the start-up hook or ``run`` (``tfamp-run``).

The precision doctor's front doors are here too: ``diagnose`` (on a private copy of a
loss's graph) and ``doctor_session`` / ``doctor_state`` / ``doctor_run`` (sessions that
probe a program's float32 graph in place of the rewrite).

May import: the shared basics, ``graph_rewrite`` (the pass it runs), ``doctor`` (the probes)
and ``fused_op`` (the unscale-and-check step of loss scaling, and the RoundToHalf op that
emulated numerics round with).  Not ``saved_graph``.
"""
