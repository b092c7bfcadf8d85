"""One Horovod rank of test_horovod_wrap_orders: trains three steps, prints its states.

Usage: ``python horovod_worker.py hvd_outer|hvd_inner`` under Horovod's Gloo environment.
Rank 1 overflows at the second step; rank 0 never does.  Prints one JSON list: the global
variables after each step.
"""
from __future__ import annotations

import json
import sys

import horovod.tensorflow as hvd
import tensorflow as tf
from loss_scaling_problems import build, initialized_session, run

from tfamp_rewrite import DynamicLossScale, LossScaleOptimizer

tf1 = tf.compat.v1


def make_optimizer(order):
    def loss_scaled(inner):
        return LossScaleOptimizer(inner, DynamicLossScale(2.0**10))

    momentum = tf1.train.MomentumOptimizer(0.05, momentum=0.9)
    if order == "hvd_outer":
        return hvd.DistributedOptimizer(loss_scaled(momentum))
    return loss_scaled(hvd.DistributedOptimizer(momentum))


def main(order):
    hvd.init()
    problem = build(lambda: make_optimizer(order))
    with problem.graph.as_default():
        broadcast = hvd.broadcast_global_variables(0)
    overflows = [1.0, float("inf") if hvd.rank() == 1 else 1.0, 1.0]
    with initialized_session(problem) as session:
        session.run(broadcast)
        states = run(problem, overflows, session=session)
    print(json.dumps([{name: value.tolist() for name, value in s.items()} for s in states]))


if __name__ == "__main__":
    main(sys.argv[1])
