"""Grappler's ``python/grappler/auto_mixed_precision_test.py``, test by test.

Each graph is built as the Python test builds it (tf.compat.v1, control flow v1,
reference variables) and checked three ways:

* ``test_matches_tensorflow``: TensorFlow's own CPU pass gives the same dtype on every
  float attribute and every Cast we add, and itself meets the test's expectations;
* ``test_expectations``: the test's own assertions (the output dtype of named nodes, the
  Casts it counts) on our rewrite, under ``compat="tf1.15"`` (the file was written for
  it) and the default compat, with the differences between them named;
* ``test_outputs_close``: the rewritten graph (default compat) trains / runs and its
  fetches match the original's within the test's tolerance, computed as the GPU the test
  was written for computes them (``numerics="emulate"``); the graph with this CPU's own
  half kernels runs too.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Dict, Mapping, Optional, Tuple

import grappler_peer_graphs as peers
import numpy as np
import pytest
from graph_runner import run_graph
from grappler_cases import Divergence, assert_same_as_tensorflow, nodes_by_name, output_dtype
from grappler_oracle import oracle_compat

from tfamp_rewrite import rewrite_graph_def

CAST_NAME = re.compile(r"-CastTo(Fp16|Fp32)(-\d+)?-AutoMixedPrecision$")


@dataclass(frozen=True)
class Peer:
    """One Python test: its graph, the nodes whose output 0 it expects in fp16 / fp32, the
    ``(to fp16, to fp32)`` Casts it counts, and named differences per compat."""

    id: str
    build: Callable[[], peers.PeerGraph]
    half: str = ""
    float32: str = ""
    casts: Optional[Tuple[int, int]] = None
    tolerance: Tuple[float, float] = (1e-3, 1e-3)   # (atol, rtol) of assertAllClose
    differs: Mapping[str, Divergence] = field(default_factory=dict)   # compat -> ...

    def expected(self, divergence: Optional[Divergence] = None) -> Dict[str, str]:
        result = {name: "float16" for name in self.half.split()}
        result.update({name: "float32" for name in self.float32.split()})
        for name in divergence.keys.split() if divergence else ():
            result[name] = "float32" if result[name] == "float16" else "float16"
        return result


def _loop(number: int, inp: str, body: str, out: str) -> Peer:
    """propagation_through_simple_loop_<n>: one letter per node (w allow, g infer, c clear,
    b deny); capitals are expected fp16."""
    names = (["input_%d" % i for i in range(len(inp))]
             + ["while/body_%d" % i for i in range(len(body))]
             + ["output_%d" % i for i in range(len(out))])
    letters = inp + body + out
    return Peer("propagation_through_simple_loop_%d" % number,
                partial(peers.simple_loop_colors, inp, body, out),
                half=" ".join(n for n, c in zip(names, letters) if c.isupper()),
                float32=" ".join(n for n, c in zip(names, letters) if c.islower()),
                tolerance=(2e-3, 1e-3))


def _suffixed(*names, count=6):
    return " ".join(n + s for s in [""] + ["_%d" % i for i in range(1, count)] for n in names)


PEERS = [
    Peer("conv_bn", peers.conv_bn, half="Conv2D FusedBatchNormV3 Conv2D_1", casts=(3, 1)),
    Peer("conv_bn_dropout", peers.conv_bn_dropout, tolerance=(2e-3, 2e-3),
         half="Conv2D FusedBatchNormV3 addition Conv2D_1",
         differs={"tf1.15": Divergence(
             "FusedBatchNormV3 addition",
             "TF 2.15 builds nn.dropout with SelectV2, which TF 1.15's clear list lacks "
             "(its dropout was a Mul): the path between Conv2D and Conv2D_1 is cut")}),
    Peer("conv_pool", peers.conv_pool, half="Conv2D Relu MaxPool Conv2D_1", casts=(4, 1),
         differs={"latest": Divergence(
             "", "(b) infer-after-allow makes BiasAdd_1 (after Conv2D_1) fp16, so its bias "
             "Const needs a Cast too", casts=(5, 1))}),
    Peer("simple_loop", peers.simple_loop, half="while/MatMul while/Relu"),
    Peer("loop_with_vars_intertwined", peers.loop_with_vars_intertwined,
         half="while/MatMul while/Relu while/MatMul_1 while/Relu_1"),
    Peer("multi_paths", peers.multi_paths, half="split concat " + _suffixed("Conv2D", "Relu", "MaxPool")),
    Peer("multi_paths_2", peers.multi_paths_2, half="MatMul Relu MatMul_1 Relu_1"),
    Peer("recurrent_lstm", peers.recurrent_lstm,
         half="while/concat while/MatMul while/split while/Sigmoid while/Sigmoid_1 "
              "while/Sigmoid_2 while/Tanh while/Tanh_1"),
    _loop(1, "W", "C", "C"),
    _loop(2, "C", "C", "W"),
    _loop(3, "W", "G", "W"),
    _loop(4, "W", "gbg", "W"),
    _loop(5, "b", "gWC", "c"),
    _loop(6, "b", "CWCG", "C"),
    _loop(7, "C", "GWCG", "C"),
    _loop(8, "C", "CgbgWC", "g"),
    # The function's op type is only in the graph's library, not the op registry.
    Peer("noninlined_funcdef", peers.noninlined_funcdef, half="MatMul"),
    # Enter nodes in front of reference-variable reads must stay float32, or the loop
    # cannot run (test_outputs_close runs three training steps).
    Peer("ingraph_train_loop", peers.ingraph_train_loop,
         half="while/dense/MatMul while/gradients/while/dense/MatMul_grad/MatMul_1"),
]


@pytest.fixture(scope="module", autouse=True)
def tf1_graph_mode():
    """Control flow v1 and reference variables while this module builds its graphs."""
    with peers.tf1_graph_mode():
        yield


@functools.lru_cache(maxsize=None)
def peer_graph(build) -> peers.PeerGraph:
    return build()


def output_dtypes(graph_def, names) -> Dict[str, str]:
    nodes = nodes_by_name(graph_def)
    return {name: output_dtype(nodes[name]) for name in names}


def counted_casts(graph_def, original) -> Tuple[int, int]:
    """``(to fp16, to fp32)`` Casts the rewrite added, counted by name as the test does."""
    names = {node.name for node in original.node}
    kinds = [CAST_NAME.search(n.name).group(1) for n in graph_def.node
             if n.name not in names and CAST_NAME.search(n.name)]
    return kinds.count("Fp16"), kinds.count("Fp32")


def assert_peer_expectations(peer: Peer, graph_def, original, divergence=None) -> None:
    expected = peer.expected(divergence)
    assert output_dtypes(graph_def, expected) == expected
    casts = divergence.casts if divergence and divergence.casts else peer.casts
    if casts is not None:
        assert counted_casts(graph_def, original) == casts


@pytest.mark.parametrize("peer", PEERS, ids=lambda peer: peer.id)
def test_matches_tensorflow(peer: Peer):
    """Same dtypes and Casts as TensorFlow's pass, and TensorFlow meets the expectations.

    TensorFlow 2.15.1's CPU pass has no infer-after-allow, so it meets the expectations
    as written, conv_pool's 4 Casts included; a TensorFlow that has it (``oracle_compat()``
    is ``latest``, e.g. 2.21) meets them with ``differs["latest"]`` applied."""
    graph = peer_graph(peer.build)
    theirs = assert_same_as_tensorflow(graph.graph_def, graph.fetch_nodes)
    divergence = peer.differs.get("latest") if oracle_compat() == "latest" else None
    assert_peer_expectations(peer, theirs, graph.graph_def, divergence)


@pytest.mark.parametrize("compat", ["tf1.15", "latest"])
@pytest.mark.parametrize("peer", PEERS, ids=lambda peer: peer.id)
def test_expectations(peer: Peer, compat: str):
    """The Python test's assertions on our rewrite (GPU target, as the test ran)."""
    graph = peer_graph(peer.build)
    result = rewrite_graph_def(graph.graph_def, fetches=graph.fetch_nodes, compat=compat)
    assert_peer_expectations(peer, result.graph_def, graph.graph_def, peer.differs.get(compat))


@pytest.mark.parametrize("peer", PEERS, ids=lambda peer: peer.id)
def test_outputs_close(peer: Peer):
    """The rewritten graph runs and its fetches match the original's (assertAllClose)."""
    graph = peer_graph(peer.build)
    expected = run_graph(graph.graph_def, list(graph.fetches), init=graph.init)
    emulated, native = (run_graph(rewrite_graph_def(graph.graph_def, fetches=graph.fetch_nodes,
                                                    numerics=numerics).graph_def,
                                  list(graph.fetches), init=graph.init)
                        for numerics in ("emulate", "native"))
    atol, rtol = peer.tolerance
    for name, want, got, ran in zip(graph.fetches, expected, emulated, native):
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=name)
        assert ran.dtype == want.dtype and ran.shape == want.shape, name


def test_graphs_are_built_as_tf115_built_them():
    """Control flow v1 (Enter / NextIteration) and reference variables (VariableV2)."""
    ops = {node.op for node in peer_graph(peers.simple_loop).graph_def.node}
    assert {"Enter", "NextIteration", "VariableV2"} <= ops
    assert not ops & {"While", "StatelessWhile", "VarHandleOp"}
