"""A small regression whose gradients a test can make inf or nan, and a way to step it.

``build(make_optimizer)`` builds, in a fresh graph, ``loss = mean((x @ w - y)**2) *
overflow`` where ``overflow`` is a placeholder defaulting to 1: feed ``inf`` or ``nan`` to
poison every gradient of that step.  ``run`` feeds a list of such values and returns the
value of every global variable (weights, slots, ``global_step``, loss-scale state) after
each step, keyed by variable name.
"""
from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

SCALE = "loss_scale/current_loss_scale"
GOOD_STEPS = "loss_scale/good_steps"

Problem = collections.namedtuple(
    "Problem", ["graph", "overflow", "loss", "train_op", "optimizer"]
)


def regression_data(rows=8):
    features = np.random.RandomState(0).uniform(-1.0, 1.0, (rows, 3)).astype(np.float32)
    targets = features @ np.array([2.0, -1.0, 0.5], np.float32) + 0.25
    return features, targets


def build(make_optimizer, *, minimize=None):
    """Builds the problem; ``minimize(optimizer, loss, global_step)`` makes the train op."""
    graph = tf.Graph()
    with graph.as_default():
        overflow = tf1.placeholder_with_default(1.0, [], name="overflow")
        features, targets = regression_data()
        w = tf1.get_variable("w", initializer=[0.5, -0.25, 1.0], use_resource=True)
        b = tf1.get_variable("b", initializer=0.0, use_resource=True)
        prediction = tf1.linalg.matvec(tf1.constant(features), w) + b
        loss = tf1.reduce_mean(tf1.square(prediction - targets)) * overflow
        global_step = tf1.train.get_or_create_global_step()
        optimizer = make_optimizer()
        if minimize is None:
            train_op = optimizer.minimize(loss, global_step=global_step)
        else:
            train_op = minimize(optimizer, loss, global_step)
    return Problem(graph, overflow, loss, train_op, optimizer)


def global_state(session):
    """``{variable name: value}`` for every global variable of the session's graph."""
    with session.graph.as_default():
        variables = tf1.global_variables()
    values = session.run(variables)
    return {v.op.name: np.array(value) for v, value in zip(variables, values)}


def initialized_session(problem):
    session = tf1.Session(graph=problem.graph)
    with problem.graph.as_default():
        session.run(tf1.global_variables_initializer())
    return session


def run(problem, overflows, session=None, feeds=None):
    """Runs one step per entry of ``overflows``; returns the global state after each.

    Without ``session`` the steps run in a new one, from freshly initialized variables.
    """
    own_session = session is None
    if own_session:
        session = initialized_session(problem)
    states = []
    try:
        for overflow in overflows:
            feed_dict = dict(feeds or {})
            feed_dict[problem.overflow] = overflow
            session.run(problem.train_op, feed_dict)
            states.append(global_state(session))
    finally:
        if own_session:
            session.close()
    return states


def without_loss_scale(state):
    """``state`` with the loss-scale variables left out: what a skipped step must not touch."""
    return {name: value for name, value in state.items() if "loss_scale" not in name}


def assert_same_values(first, second):
    assert sorted(first) == sorted(second)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
