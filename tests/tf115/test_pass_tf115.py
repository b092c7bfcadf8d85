"""Graphs rewritten by the pass import and run in TensorFlow 1.15, and compute what 2.x computes.

Each model of tests/support/model_graphs.py is turned into the GraphDef TensorFlow 1.15
itself writes (tf115_graphs.py), rewritten here for the CPU with ``compat="tf1.15"`` and
``"latest"``, natively and with emulated numerics, and every variant runs in TensorFlow 1.15
and in 2.x (each in a child process, same config: Grappler off) at the initial weights and
after three training steps.

Tolerances: tests/support/tf115_compare.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from graph_runner import plain_config
from model_graphs import MODELS
from tf115_compare import forward_bound, relative_difference, trained_bound
from tf115_graphs import op_attrs, portable_graph, written_by_tf115

from tfamp_rewrite import rewrite_graph_def

TRAINING_STEPS = 3
VARIANTS = [(compat, numerics) for compat in ("tf1.15", "latest") for numerics in ("native", "emulate")]


@pytest.fixture(scope="module")
def known_attrs(tf115):
    return op_attrs(tf115.all_op_list())


def run_model(runtime, graph_def, model, feeds, outputs):
    """Outputs at the initial weights and, for training graphs, after TRAINING_STEPS steps."""
    training = model.fetches[0] == "train_op"
    steps = [({}, [], [model.init]), (feeds, outputs, [])]
    if training:
        steps += [(feeds, [], [model.fetches[0]])] * TRAINING_STEPS + [(feeds, outputs, [])]
    results = runtime.run_steps(graph_def.SerializeToString(), steps, plain_config().SerializeToString())
    return results[1], (results[-1] if training else None)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_rewritten_model_runs_in_tf115_as_in_tf2(name, tf115, tf2, known_attrs, verified):
    model = MODELS[name]()
    training = model.fetches[0] == "train_op"
    outputs = [fetch + ":0" for fetch in (model.fetches[1:] if training else model.fetches)]
    source = written_by_tf115(portable_graph(model, model.fetches) if training else model.graph_def,
                              tf115, known_attrs)
    assert 0 < source.versions.producer < model.graph_def.versions.producer
    feeds = model.feed_values(np.random.default_rng(0))
    variants = {"float32": (source, "float32", 0)}
    for compat, numerics in VARIANTS:
        result = rewrite_graph_def(source, fetches=model.fetches, feeds=model.feeds, target="cpu",
                                   compat=compat, numerics=numerics)
        assert result.report.nodes_converted > 0
        variants["%s/%s" % (compat, numerics)] = (result.graph_def, numerics,
                                                  result.report.nodes_converted)
    lines = []
    for label, (graph_def, numerics, converted) in variants.items():
        forward, trained = run_model(tf115, graph_def, model, feeds, outputs)
        forward_2, trained_2 = run_model(tf2, graph_def, model, feeds, outputs)
        assert all(np.all(np.isfinite(value)) for value in forward), label
        differences = [relative_difference(a, b) for a, b in zip(forward, forward_2)]
        assert max(differences) <= forward_bound(graph_def, numerics), (label, differences)
        line = "forward %.1e" % max(differences)
        if training:
            after = [relative_difference(a, b) for a, b in zip(trained, trained_2)]
            assert max(after) <= trained_bound(numerics), (label, "after training", after)
            line += ", after %d steps %.1e" % (TRAINING_STEPS, max(after))
        lines.append("%s (%d half nodes) %s" % (label, converted, line))
    verified("graphs rewritten by the pass", "%s: runs in TF 1.15; max rel. difference to TF 2.x: %s"
             % (name, "; ".join(lines)))
