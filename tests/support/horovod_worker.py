"""One Horovod rank of test_horovod_wrap_orders: trains four steps per scenario, reports JSON.

Usage: ``python horovod_worker.py SCENARIO...`` under Horovod's Gloo environment (see
horovod_launch), with ``TFAMP_REWRITE_TARGET=cpu`` so sessions run the float16 rewrite.

Scenarios (``SCENARIOS``) are the wrap orders, each also with ``hvd.Compression.fp16``
and with ``backward_passes_per_step=2`` (refused inside), and ``env``: a plain
``hvd.DistributedOptimizer(opt)`` that scales its loss by itself, which needs
``TF_ENABLE_AUTO_MIXED_PRECISION=1`` set before the process starts.

Every rank differs where Horovod must make it agree: rank r scales its loss by ``1 + r``
(different local gradients), starts with ``w + r`` and, where the scenario picks the
scale, an initial loss scale of ``2**10 * (1 + r)``.  Rank 1 alone overflows at the
second step (at the first, which has no allreduce, when accumulating).

Prints one JSON line: per scenario, the global variables after the broadcast and after
each step, and the Horovod ops of the graph as the test needs them -- or, for a
scenario refused with a ValueError, its message.
"""
from __future__ import annotations

import json
import sys

import horovod.tensorflow as hvd
import tensorflow as tf
from cond_branches import nodes_in_data_dependent_conds
from loss_scaling_problems import build, global_state
from tf1_behavior import tf1_behavior_requested, use_tf1_behavior

import tfamp_rewrite
from tfamp_rewrite import DynamicLossScale, LossScaleOptimizer

tf1 = tf.compat.v1
if tf1_behavior_requested():  # a rank of a --tf1-behavior test run
    use_tf1_behavior()


def momentum():
    return tf1.train.MomentumOptimizer(0.05, momentum=0.9)


def loss_scale():
    return DynamicLossScale(2.0**10 * (1 + hvd.rank()))


SCENARIOS = {
    "hvd_outer": lambda: hvd.DistributedOptimizer(
        tfamp_rewrite.enable_mixed_precision_graph_rewrite(momentum(), loss_scale())),
    "hvd_inner": lambda: LossScaleOptimizer(hvd.DistributedOptimizer(momentum()), loss_scale()),
    "hvd_outer_fp16": lambda: hvd.DistributedOptimizer(
        tfamp_rewrite.enable_mixed_precision_graph_rewrite(momentum(), loss_scale()),
        compression=hvd.Compression.fp16),
    "hvd_inner_fp16": lambda: LossScaleOptimizer(
        hvd.DistributedOptimizer(momentum(), compression=hvd.Compression.fp16), loss_scale()),
    "hvd_outer_accumulate": lambda: hvd.DistributedOptimizer(
        tfamp_rewrite.enable_mixed_precision_graph_rewrite(momentum(), loss_scale()),
        backward_passes_per_step=2),
    "hvd_inner_accumulate": lambda: LossScaleOptimizer(
        hvd.DistributedOptimizer(momentum(), backward_passes_per_step=2), loss_scale()),
    "env": lambda: hvd.DistributedOptimizer(momentum()),
}


def loss_factors(scenario):
    """What each of the four steps multiplies this rank's loss by."""
    factor = 1.0 + hvd.rank()
    factors = [factor] * 4
    if hvd.rank() == 1:  # at step 2; accumulating, at step 1, the one without an allreduce
        factors[0 if scenario.endswith("_accumulate") else 1] = float("inf")
    return factors


def allreduce_dtypes(graph_def):
    """The dtypes Horovod allreduces in, wherever its ops are (Horovod puts them in conds)."""
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return sorted({tf.as_dtype(n.attr["T"].type).name for n in nodes if n.op == "HorovodAllreduce"})


def collectives_in_data_dependent_conds(graph_def):
    """``(number of data-dependent conds, Horovod ops that run only if one says so)``.

    Horovod itself wraps each allreduce in a cond on a constant (process-set membership);
    a cond whose predicate is computed, such as the skip-this-step one, must hold none.
    """
    count, inside = nodes_in_data_dependent_conds(graph_def)
    ops = {node.name: node.op for node in graph_def.node}
    ops.update({node.name: node.op for f in graph_def.library.function for node in f.node_def})
    return count, [name for name in inside if ops.get(name, "").startswith("Horovod")]


def train_with_broadcast_op(problem, factors):
    """Perturbs this rank's weights, broadcasts rank 0's variables, runs the steps."""
    with problem.graph.as_default():
        perturb = [v.assign(v + hvd.rank()) for v in tf1.trainable_variables()]
        broadcast = hvd.broadcast_global_variables(0)
        initialize = [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
    with tfamp_rewrite.Session(graph=problem.graph) as session:
        session.run(initialize)
        session.run(perturb)
        session.run(broadcast)
        return [global_state(session)] + [step(problem, session, f) for f in factors]


def train_with_broadcast_hook(problem, factors):
    """The TF1 way: a MonitoredTrainingSession whose hook broadcasts the variables."""
    with problem.graph.as_default(), tf1.train.MonitoredTrainingSession(
        hooks=[hvd.BroadcastGlobalVariablesHook(0)]
    ) as session:
        return [global_state(session)] + [step(problem, session, f) for f in factors]


def step(problem, session, factor):
    session.run(problem.train_op, {problem.overflow: factor})
    return global_state(session)


def main(scenarios):
    hvd.init()
    report = {}
    for scenario in scenarios:
        try:
            problem = build(SCENARIOS[scenario])
        except ValueError as error:
            report[scenario] = {"refused": str(error)}
            continue
        train = train_with_broadcast_hook if scenario == "env" else train_with_broadcast_op
        states = train(problem, loss_factors(scenario))
        graph_def = problem.graph.as_graph_def()
        conds, collectives = collectives_in_data_dependent_conds(graph_def)
        report[scenario] = {
            "states": [{name: value.tolist() for name, value in s.items()} for s in states],
            "allreduce_dtypes": allreduce_dtypes(graph_def),
            "data_dependent_conds": conds,
            "collectives_in_them": collectives,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
