"""TensorFlow's own Grappler AMP pass, run from Python on the CPU: the test oracle.

``run_grappler_amp(graph_def, fetches, feeds, dtype)`` runs only the AMP pass
(``auto_mixed_precision_cpu`` for float16 with emulation off, or
``auto_mixed_precision_onednn_bfloat16``) and returns the rewritten GraphDef.
TensorFlow swallows pass failures and returns the input unchanged, so
``OracleRun.succeeded`` tells them apart by the files the pass writes to its log path.

``oracle_lists(dtype)`` reads the lists this TensorFlow really uses (its paintbuckets
file) and ``oracle_compat()`` probes whether it applies infer-after-allow, so the
differential tests compare algorithms, not list versions.

The bfloat16 pass needs oneDNN and a CPU it runs bfloat16 on (AVX-512): elsewhere
TensorFlow skips it silently.  ``require_oracle(dtype)`` probes that at run time and skips the
calling test with the reason; tests of our own expectations run on every CPU.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf
from cpu_features import cpu_flags, onednn_disabled
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer

from tfamp_rewrite.graph_rewrite.op_lists import OpLists

OPTIMIZERS = {"float16": "auto_mixed_precision_cpu", "bfloat16": "auto_mixed_precision_onednn_bfloat16"}
_LIST_HEADERS = {"AllowList": "allow", "InferList": "infer", "DenyList": "deny", "ClearList": "clear",
                 "WhiteList": "allow", "GrayList": "infer", "BlackList": "deny"}


@dataclass
class OracleRun:
    graph_def: graph_pb2.GraphDef
    succeeded: bool      # the pass ran to the end (it writes its post-op dump then)
    lists: OpLists = None


@contextlib.contextmanager
def _env(**values):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def meta_graph_for(graph_def, fetches=(), feeds=()):
    """A MetaGraphDef whose fetches (train_op) and feeds (a signature) Grappler preserves."""
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    for name in fetches:
        meta.collection_def["train_op"].node_list.value.append(name)
    if feeds:
        nodes = {node.name: node for node in graph_def.node}
        signature = meta.signature_def["feeds"]
        for i, name in enumerate(feeds):
            info = signature.inputs["in%d" % i]
            info.name = name if ":" in name else name + ":0"
            node = nodes[info.name.split(":")[0]]
            # Grappler materialises feeds: it needs their dtype (and shape, if known).
            info.dtype = node.attr["dtype"].type if "dtype" in node.attr else tf.float32.as_datatype_enum
            if "shape" in node.attr:
                info.tensor_shape.CopyFrom(node.attr["shape"].shape)
    return meta


def run_grappler_amp(graph_def, fetches=(), feeds=(), dtype="float16", **env) -> OracleRun:
    """Runs TensorFlow's AMP pass alone on ``graph_def``; ``env`` sets TF_* variables
    (``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16="1"`` for its fp16 emulation)."""
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append(OPTIMIZERS[dtype])
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    with tempfile.TemporaryDirectory() as log_dir:
        settings = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16": "0", **env,
                    "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH": log_dir}
        with _env(**settings):
            output = tf_optimizer.OptimizeGraph(config, meta_graph_for(graph_def, fetches, feeds))
        buckets = glob.glob(os.path.join(log_dir, "paintbuckets_*graph_to_optimize*.txt"))
        lists = _parse_paintbuckets(buckets[0]) if buckets else None
        return OracleRun(output, succeeded=bool(buckets), lists=lists)


def _parse_paintbuckets(path) -> OpLists:
    sets, current = {}, None
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if line.endswith(":") and line[:-1] in _LIST_HEADERS:
                current = sets.setdefault(_LIST_HEADERS[line[:-1]], set())
            elif line and current is not None:
                current.add(line)
    return OpLists(**{name: frozenset(sets.get(name, ())) for name in ("allow", "infer", "deny", "clear")})


def _probe_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.ones([8, 8], np.float32), name="w")
        tf.identity(tf.tanh(tf.linalg.matmul(x, w, name="mm"), name="tanh"), name="out")
    return graph.as_graph_def()


@functools.lru_cache(maxsize=None)
def _probe_run(dtype: str) -> OracleRun:
    return run_grappler_amp(_probe_graph(), fetches=["out"], dtype=dtype)


@functools.lru_cache(maxsize=None)
def oracle_unavailable(dtype="float16") -> Optional[str]:
    """Why TensorFlow's pass for ``dtype`` cannot be the oracle on this CPU; None if it can."""
    if _probe_run(dtype).succeeded:
        return None
    if dtype != "bfloat16":
        return "TensorFlow's %s pass did not run on a probe graph" % OPTIMIZERS[dtype]
    missing = [flag for flag in ("avx512f", "avx512_bf16") if flag not in cpu_flags()]
    if onednn_disabled():
        why = "TF_ENABLE_ONEDNN_OPTS=0 turns oneDNN off"
    elif missing:
        why = "no AVX-512 BF16: %s not in its flags" % ", ".join(missing)
    else:
        why = "it did not run on a probe graph"
    return "TensorFlow's oneDNN bfloat16 pass is unavailable on this CPU (%s)" % why


def require_oracle(dtype="float16") -> None:
    """Skips the calling test, with the reason, where TensorFlow's pass cannot run."""
    reason = oracle_unavailable(dtype)
    if reason:
        pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def oracle_lists(dtype="float16") -> OpLists:
    """The op lists the installed TensorFlow's pass uses (read from its paintbuckets dump)."""
    require_oracle(dtype)
    return _probe_run(dtype).lists


@functools.lru_cache(maxsize=None)
def oracle_compat() -> str:
    """``latest`` if the installed TensorFlow applies infer-after-allow in CPU mode, else ``tf2.15``."""
    run = run_grappler_amp(_probe_graph(), fetches=["out"])
    tanh = next(n for n in run.graph_def.node if n.name == "tanh")
    return "latest" if tanh.attr["T"].type == tf.float16.as_datatype_enum else "tf2.15"


def type_attrs(node):
    """``{attr: dtype}`` for every type / list(type) attribute of a NodeDef."""
    result = {}
    for name, value in node.attr.items():
        kind = value.WhichOneof("value")
        if kind == "type":
            result[name] = value.type
        elif kind == "list" and value.list.type:
            for i, dtype in enumerate(value.list.type):
                result["%s[%d]" % (name, i)] = dtype
    return result


def dtype_differences(original, ours, theirs):
    """``[(node, attr, ours, theirs)]`` for every float type attribute of an original node."""
    ours_by_name = {n.name: n for n in ours.node}
    theirs_by_name = {n.name: n for n in theirs.node}
    differences = []
    for node in original.node:
        for attr, dtype in type_attrs(node).items():
            if dtype != tf.float32.as_datatype_enum:
                continue
            mine = type_attrs(ours_by_name[node.name]).get(attr)
            other = type_attrs(theirs_by_name[node.name]).get(attr)
            if mine != other:
                differences.append((node.name, attr, tf.as_dtype(mine).name, tf.as_dtype(other).name))
    return differences


def count_casts(graph_def, original):
    names = {n.name for n in original.node}
    return sum(1 for n in graph_def.node if n.op == "Cast" and n.name not in names)


def function_dtype_differences(ours, theirs):
    """Like ``dtype_differences`` for the bodies of the functions both libraries hold."""
    theirs_by_name = {f.signature.name: f for f in theirs.library.function}
    differences = []
    for function in ours.library.function:
        other = theirs_by_name[function.signature.name]
        other_nodes = {n.name: n for n in other.node_def}
        for node in function.node_def:
            if node.name not in other_nodes:
                continue  # a Cast only one side added; cast counts are compared separately
            mine, their = type_attrs(node), type_attrs(other_nodes[node.name])
            for attr in set(mine) | set(their):
                if mine.get(attr) != their.get(attr):
                    differences.append((function.signature.name, node.name, attr))
    return differences
