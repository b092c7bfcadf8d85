"""What a session really executed in one step: half-precision kernels, bytes, XLA clusters.

``trace_step`` runs one step with ``FULL_TRACE`` and ``output_partition_graphs``;
``ExecutedGraph.from_run_metadata`` reads the result:

* compute nodes -- ops whose type contains ``Conv`` or ``MatMul`` (oneDNN's renamed
  ``_MklNative...`` kernels included) in the partition graphs, the graphs the executor
  ran after every rewrite -- split by their ``T`` attribute: half or not;
* output bytes -- the bytes of every tensor the step's kernels produced (step stats),
  in total and in float16/bfloat16, and the same for activations: tensors of rank >= 2
  whose first dimension is the batch size (weights, their gradients and casts are the
  rest; in a small model they can outweigh the activations).  Under XLA only what the
  clusters hand back is visible, not what runs inside them;
* XLA ops -- ``_XlaCompile`` / ``_XlaRun`` nodes (auto-clustering compiled the graph).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Dict

import tensorflow as tf
from tensorflow.core.framework import types_pb2

tf1 = tf.compat.v1
HALF_TYPES = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)
XLA_OPS = ("_XlaCompile", "_XlaRun")


def is_compute_op(op_type: str) -> bool:
    return "Conv" in op_type or "MatMul" in op_type


def op_name(executed_op: str) -> str:
    """The graph op behind an executed kernel op: oneDNN's ``_Mkl`` / ``_MklNative`` dropped."""
    return re.sub(r"^_Mkl(Native)?", "", executed_op)


@dataclass
class ExecutedGraph:
    """Counts from one traced step (see the module docstring)."""

    half_compute_nodes: int = 0
    float_compute_nodes: int = 0
    output_bytes: int = 0
    half_output_bytes: int = 0
    activation_bytes: int = 0
    half_activation_bytes: int = 0
    xla_ops: Dict[str, int] = field(default_factory=dict)
    half_compute_ops: Dict[str, int] = field(default_factory=dict)  # op type -> half nodes

    @property
    def xla_compiled(self) -> bool:
        return all(self.xla_ops.get(op, 0) > 0 for op in XLA_OPS)

    def to_dict(self) -> dict:
        result = asdict(self)
        result["xla_compiled"] = self.xla_compiled
        return result

    def line(self) -> str:
        """One line for the progress output."""
        return ("executed graph: %d half / %d float conv+matmul nodes; per step %.2f MB of outputs "
                "(%.0f%% half), %.2f MB of them activations (%.0f%% half); XLA %s" % (
                    self.half_compute_nodes, self.float_compute_nodes, self.output_bytes / 1e6,
                    100.0 * self.half_output_bytes / max(1, self.output_bytes),
                    self.activation_bytes / 1e6,
                    100.0 * self.half_activation_bytes / max(1, self.activation_bytes),
                    "clusters compiled (%s)" % ", ".join("%s x%d" % op for op in sorted(self.xla_ops.items()))
                    if self.xla_ops else "off"))

    @classmethod
    def from_run_metadata(cls, run_metadata, batch_size: int) -> "ExecutedGraph":
        stats = cls()
        for partition in run_metadata.partition_graphs:
            for node in partition.node:
                if node.op in XLA_OPS:
                    stats.xla_ops[node.op] = stats.xla_ops.get(node.op, 0) + 1
                if not is_compute_op(node.op) or "T" not in node.attr:
                    continue
                if node.attr["T"].type in HALF_TYPES:
                    stats.half_compute_nodes += 1
                    op = op_name(node.op)
                    stats.half_compute_ops[op] = stats.half_compute_ops.get(op, 0) + 1
                else:
                    stats.float_compute_nodes += 1
        for device in run_metadata.step_stats.dev_stats:
            for node_stats in device.node_stats:
                for output in node_stats.output:
                    description = output.tensor_description
                    size = description.allocation_description.requested_bytes
                    half = description.dtype in HALF_TYPES
                    stats.output_bytes += size
                    stats.half_output_bytes += size if half else 0
                    dims = description.shape.dim
                    if len(dims) >= 2 and dims[0].size == batch_size:
                        stats.activation_bytes += size
                        stats.half_activation_bytes += size if half else 0
        return stats


def trace_step(session, fetches, batch_size: int, feed_dict=None):
    """Runs ``fetches`` once, traced; returns ``(values, ExecutedGraph)``."""
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True)
    run_metadata = tf1.RunMetadata()
    values = session.run(fetches, feed_dict, options=options, run_metadata=run_metadata)
    return values, ExecutedGraph.from_run_metadata(run_metadata, batch_size)
