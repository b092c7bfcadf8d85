"""LossScaleOptimizer inside and outside Horovod's DistributedOptimizer and SyncReplicas.

Horovod's TF1 ``DistributedOptimizer`` allreduces in ``compute_gradients`` and passes
``apply_gradients`` through.  ``FakeDistributedOptimizer`` does the same with the
allreduce replaced by ``gradient + other_ranks``, a placeholder standing for what the
other ranks contribute: feeding it inf makes only *another* rank overflow, which every
rank must notice, whichever way the optimizers are nested.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf
from cond_branches import nodes_in_data_dependent_conds
from loss_scaling_problems import (
    SCALE,
    assert_same_values,
    build,
    initialized_session,
    run,
    without_loss_scale,
)

from tfamp_rewrite import DynamicLossScale, LossScaleOptimizer

tf1 = tf.compat.v1
ALLREDUCE = "HorovodAllreduce"


class FakeDistributedOptimizer(tf1.train.Optimizer):
    """Horovod's TF1 DistributedOptimizer, reducing with a stand-in for the other ranks."""

    def __init__(self, optimizer):
        super().__init__(False, "Distributed" + type(optimizer).__name__)
        self._optimizer = optimizer
        self.other_ranks = tf1.placeholder_with_default(0.0, [], name="other_ranks")

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        return [(None if g is None else tf1.identity(g + self.other_ranks, name=ALLREDUCE), v)
                for g, v in pairs]

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def momentum():
    return tf1.train.MomentumOptimizer(0.05, momentum=0.9)


def loss_scaled(inner):
    return LossScaleOptimizer(inner, DynamicLossScale(2.0**10))


WRAP_ORDERS = [
    pytest.param(lambda: FakeDistributedOptimizer(loss_scaled(momentum())), id="hvd_outer"),
    pytest.param(lambda: loss_scaled(FakeDistributedOptimizer(momentum())), id="hvd_inner"),
]


def _other_ranks(problem):
    return problem.graph.get_tensor_by_name("other_ranks:0")


@pytest.mark.parametrize("make_optimizer", WRAP_ORDERS)
def test_overflow_on_another_rank_skips_the_step_here(make_optimizer):
    problem = build(make_optimizer)
    with initialized_session(problem) as session:
        (before,) = run(problem, [1.0], session=session)
        (skipped,) = run(problem, [1.0], session=session,
                         feeds={_other_ranks(problem): float("inf")})
        (applied,) = run(problem, [1.0], session=session)
    assert_same_values(without_loss_scale(skipped), without_loss_scale(before))
    assert skipped[SCALE] == 2.0**9
    assert applied["global_step"] == 2


@pytest.mark.parametrize("make_optimizer", WRAP_ORDERS)
def test_no_allreduce_inside_the_skip_branch(make_optimizer):
    problem = build(make_optimizer)
    graph_def = problem.graph.as_graph_def()
    reductions = [node.name for node in graph_def.node if ALLREDUCE in node.name]
    conds, branch_nodes = nodes_in_data_dependent_conds(graph_def)
    assert conds >= 1 and branch_nodes, "premise: the apply runs under a cond"
    assert len(reductions) == 2  # one per gradient (w, b), outside any branch
    assert not [name for name in branch_nodes if ALLREDUCE in name]


def test_tf_distribute_strategies_are_refused_with_the_alternatives():
    with tf.Graph().as_default():
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        with strategy.scope():
            w = tf1.Variable(1.0)
            optimizer = loss_scaled(momentum())
            with pytest.raises(RuntimeError, match="Horovod's DistributedOptimizer"):
                strategy.extended.call_for_each_replica(lambda: optimizer.minimize(w * w))


def test_horovod_hooks_are_reachable_through_the_wrapper():
    with tf.Graph().as_default():
        distributed = FakeDistributedOptimizer(momentum())
        distributed.register_local_var = lambda var: f"registered {var}"
        assert loss_scaled(distributed).register_local_var("v") == "registered v"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_sync_replicas_outside_skips_the_step_and_keeps_workers_in_step():
    inner = loss_scaled(momentum())
    replicas = []

    def make_optimizer():
        replicas.append(tf1.train.SyncReplicasOptimizer(inner, 1, total_num_replicas=1))
        return replicas[0]

    problem = build(make_optimizer)
    with problem.graph.as_default():
        hook = replicas[0].make_session_run_hook(is_chief=True)
        variables = tf1.global_variables()
    options = tf1.RunOptions(timeout_in_ms=20000)  # a stale-token deadlock fails, not hangs

    def step(session, overflow):
        session.run(problem.train_op, {problem.overflow: overflow}, options=options)
        return dict(zip([v.op.name for v in variables], session.run(variables)))

    with problem.graph.as_default(), tf1.train.MonitoredSession(
        # On close, the chief's queue runner still waits for gradients that will not come;
        # a short grace period lets closing the session cancel it.
        hooks=[hook], stop_grace_period_secs=1,
    ) as session:
        # The chief's queue runner applies asynchronously; with one worker, the first two
        # steps settle the token pipeline, after which each step returns once applied.
        step(session, 1.0)
        before = step(session, 1.0)
        skipped = step(session, float("inf"))
        applied = [step(session, 1.0) for _ in range(3)]
    for thread in threading.enumerate():  # so its cancellation is reported within this test
        if thread.name.startswith("QueueRunnerThread-sync_token_q"):
            thread.join(timeout=30)
    assert_same_values(
        {k: v for k, v in without_loss_scale(skipped).items() if k != "global_step"},
        {k: v for k, v in without_loss_scale(before).items() if k != "global_step"},
    )
    assert skipped[SCALE] == before[SCALE] / 2
    assert skipped["global_step"] == before["global_step"] + 1  # SyncReplicas' tokens need it
    assert not np.array_equal(applied[-1]["w"], skipped["w"])
