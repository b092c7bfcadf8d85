"""Sessions for timing a compiled op on each CPU path, with TensorFlow's graph optimizers off.

The op's CPU kernel picks its instruction set (AVX-512, AVX2 + F16C, scalar) when its
session constructs it, capped by ``TFAMP_CPU_ISA``: so each path gets a Session of its
own over the same graph, and the stock-op variants run in the first.
"""
from __future__ import annotations

import os

import tensorflow as tf

from tfamp_rewrite.fused_op import op as fused_op

_tf = tf.compat.v1


def plain_config():
    """Grappler and the classic graph optimizer off: they would fold ``x * 1``, prune
    unused ops, and merge or fold equal ops of constant inputs (Fills, Casts)."""
    config = _tf.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = _tf.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    config.graph_options.optimizer_options.do_common_subexpression_elimination = False
    return config


def runs_per_cpu_path(graph, targets, op_variant, label, isas, initialize):
    """``(sessions, {(scenario, variant): callable})`` for ``targets``, keyed (scenario, variant).

    Targets of ``op_variant`` run once per path in ``isas``, as variant ``label + isa``;
    the others once, in the first session.  ``initialize(session)`` runs in each new
    session first.  Every op kernel is constructed here, not in a timed run.
    """
    sessions, runs = [], {}
    for isa in isas:
        os.environ[fused_op.CPU_ISA_ENV] = isa
        session = _tf.Session(graph=graph, config=plain_config())
        initialize(session)
        for (scenario, variant), target in targets.items():
            if variant == op_variant:
                session.run(target)  # constructs the kernel now, on this path
                runs[(scenario, label + isa)] = lambda s=session, t=target: s.run(t)
        sessions.append(session)
    os.environ.pop(fused_op.CPU_ISA_ENV, None)
    for (scenario, variant), target in targets.items():
        if variant != op_variant:
            runs[(scenario, variant)] = lambda t=target: sessions[0].run(t)
    return sessions, runs
