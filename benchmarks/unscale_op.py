"""Fused UnscaleAndCheckFinite vs composite TF ops vs a memcpy bound, on ResNet-50's gradients.

    python benchmarks/unscale_op.py [--repeats 40] [--dtype float32|float16|bfloat16]

The gradient set is ResNet-50 v1.5's trainable variables (161 tensors, 25.6 M elements).
The fused op runs once per instruction-set path of its CPU kernel this CPU has (AVX-512,
AVX2 + F16C -- the path of AVX2-only machines --, scalar), each in its own Session over
the same graph (a kernel picks its path when its session constructs it, capped by
``TFAMP_CPU_ISA``); composite ops run in the same graph, with Grappler and the classic
graph optimizer off (they would fold away ``x * 1``, prune unused ops and merge the equal
Fills below).  The bound is a 2-thread memcpy of buffers of the same sizes, measured in
the same run.  Times are medians of interleaved runs; read the ratios.

Two ways the gradients reach the step, one table each:

* **as in training** (the targets' case): each gradient is a fresh buffer read only by the
  unscale step -- in a training graph the gradient ops' outputs pass through ``tf.gradients``'
  Identity tuple to it alone -- so the fused op, and TensorFlow's Mul, rewrite it in
  place.  Made here by a ``Fill`` per gradient, all done before the step starts; the
  step's time is the median over rounds of ``Fills -> step`` minus the Fills alone.
* **held elsewhere** (variable reads): every output is a new buffer.  Where TensorFlow's
  CPU allocator is plain ``malloc`` -- oneDNN off, TensorFlow's default on CPUs without
  AVX512_VNNI / AVX512_BF16 / AMX, i.e. on AVX2-only machines -- glibc hands the freed
  100 MB back to the kernel after each run and the next run page-faults it in again, at
  about 0.4x the memcpy bandwidth.  ``TF_CPU_ALLOCATOR_USE_BFC=true`` (TensorFlow's own
  pooling allocator, as oneDNN's is) removes that; the table says which allocator ran.

Targets: fused >= 0.8x the memcpy bandwidth and >= 1.5x faster than the composite ops,
as in training, on every path but scalar.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np
import tensorflow as tf

import tfamp_rewrite
from tfamp_rewrite.fused_op import op as fused_op

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, "..", "tests", "support")]  # also when imported by path
from cpu_features import describe_cpu  # noqa: E402
from cpu_path_sessions import runs_per_cpu_path  # noqa: E402

ISAS = ("avx512", "avx2", "scalar")

_tf = tf.compat.v1


def resnet50_v15_variable_shapes():
    """Shapes of ResNet-50 v1.5's trainable variables (conv kernels HWIO, BN gamma/beta, fc)."""
    shapes = [(7, 7, 3, 64), (64,), (64,)]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_channels = 4 * width
            if block == 0:  # projection shortcut
                shapes += [(1, 1, in_channels, out_channels), (out_channels,), (out_channels,)]
            for kernel in ((1, 1, in_channels, width), (3, 3, width, width),
                           (1, 1, width, out_channels)):
                shapes += [kernel, (kernel[-1],), (kernel[-1],)]
            in_channels = out_channels
    return shapes + [(2048, 1000), (1000,)]


def _seconds(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _two_thread_copy(sources, destinations):
    """Copies with 2 threads, tensors split so both halves hold about the same bytes."""
    halves, loads = ([], []), [0, 0]
    for i in sorted(range(len(sources)), key=lambda i: -sources[i].nbytes):
        half = loads.index(min(loads))
        halves[half].append(i)
        loads[half] += sources[i].nbytes

    def copy(indices):
        for i in indices:
            np.copyto(destinations[i], sources[i])  # releases the GIL

    def run():
        threads = [threading.Thread(target=copy, args=(h,)) for h in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    return run


def _session_runs(arrays, isas):
    """``{(scenario, variant): callable}``: the fused op (one Session per CPU path), the
    composite ops, and the ``Fill`` alone, over gradients as in training ("fresh") and
    gradients held by variables ("held")."""
    graph = tf.Graph()
    with graph.as_default():
        feeds = [_tf.placeholder(tf.as_dtype(a.dtype), a.shape) for a in arrays]
        variables = [tf.Variable(f) for f in feeds]
        inv_scale = tf.constant(2.0**-10)
        fills = [tf.fill(a.shape, tf.constant(1, tf.as_dtype(a.dtype))) for a in arrays]
        all_filled = tf.group(*fills)
        with tf.control_dependencies([all_filled]):  # no step starts before every Fill is done
            fresh = [tf.identity(f) for f in fills]  # shares the Fill's buffer, as tf.gradients' tuple
        gradients = {"held": [v.read_value() for v in variables], "fresh": fresh}
        targets = {("fresh", "fill"): all_filled}
        for scenario, grads in gradients.items():
            unscaled, all_finite = tfamp_rewrite.unscale_and_check_finite(grads, inv_scale)
            targets[(scenario, "fused")] = tf.group(*unscaled, all_finite)
            # The fallback implementation, measured in the same graph for a fair comparison.
            unscaled, all_finite = fused_op._unscale_composite(grads, inv_scale)
            targets[(scenario, "composite")] = tf.group(*unscaled, all_finite)
        init = _tf.global_variables_initializer()
    return runs_per_cpu_path(graph, targets, "fused", FUSED, isas,
                             lambda session: session.run(init, dict(zip(feeds, arrays))))


FUSED = "fused UnscaleAndCheckFinite, "
COPY = "memcpy, 2 threads (bound)"


def _allocator() -> str:
    """Which CPU allocator TensorFlow's kernels get in this process, as it decides."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        if _pywrap_util_port.IsMklEnabled():
            return "oneDNN's pooling allocator (oneDNN on)"
    except (ImportError, AttributeError):
        pass
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("1", "true"):
        return "TensorFlow's BFC pooling allocator (TF_CPU_ALLOCATOR_USE_BFC)"
    return "malloc (oneDNN off; TF_CPU_ALLOCATOR_USE_BFC=true would pool)"


def _print_table(title, times, nbytes, t_copy, isas):
    """One scenario's rows; returns the target lines for its non-scalar fused paths."""
    t_comp = times["composite"]
    print(f"\n{title}")
    print(f"{'':38} {'time':>9} {'GB/s':>8} {'vs memcpy b/w':>16} {'vs composite':>14}")
    for name, t in ((COPY, t_copy),) + tuple(times.items()):
        label = "composite TF ops" if name == "composite" else name
        print(f"{label:38} {1e3 * t:6.2f} ms {2 * nbytes / t / 1e9:8.1f} "
              f"{t_copy / t:15.2f}x {t_comp / t:13.2f}x")
    lines = []
    for isa in (i for i in isas if i != "scalar"):
        bandwidth, speedup = t_copy / times[FUSED + isa], t_comp / times[FUSED + isa]
        lines.append(f"targets, {isa}: fused >= 0.8x memcpy bandwidth: "
                     f"{'met' if bandwidth >= 0.8 else 'MISSED'} ({bandwidth:.2f}x); fused >= 1.5x "
                     f"composite: {'met' if speedup >= 1.5 else 'MISSED'} ({speedup:.2f}x)")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40, help="timed runs per variant")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = parser.parse_args(argv)
    if not tfamp_rewrite.fused_op_available():
        print("the fused op is unavailable (see the warning above); run `make op`.")
        return 1
    best = fused_op.cpu_kernel_isa()
    isas = ISAS[ISAS.index(best):]

    rng = np.random.default_rng(0)
    dtype = tf.as_dtype(args.dtype).as_numpy_dtype
    arrays = [rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in resnet50_v15_variable_shapes()]
    elements = sum(a.size for a in arrays)
    nbytes = sum(a.nbytes for a in arrays)
    sessions, runs = _session_runs(arrays, isas)
    variants = ((COPY, _two_thread_copy(arrays, [np.empty_like(a) for a in arrays])),) + tuple(runs.items())
    for _, run in variants:  # warm up: allocator pools, page faults, thread pools
        for _ in range(3):
            run()
    samples = {name: [] for name, _ in variants}
    for _ in range(args.repeats):  # interleaved, so load from other processes hits all alike
        for name, run in variants:
            samples[name].append(_seconds(run))
    for session in sessions:
        session.close()

    t = {name: statistics.median(s) for name, s in samples.items()}
    fill_samples = samples[("fresh", "fill")]
    fill = t.pop(("fresh", "fill"))
    # Each run of Fills -> step against the Fills-alone run of the same round: the Fills'
    # page faults (under malloc) vary from round to round, and cancel within one.
    variant_names = [FUSED + isa for isa in isas] + ["composite"]
    in_place = {name: statistics.median(a - b for a, b in zip(samples[("fresh", name)], fill_samples))
                for name in variant_names}
    print(f"CPU {describe_cpu()}; the fused op's CPU kernel would pick: {best}")
    print(f"TensorFlow's CPU allocator: {_allocator()}")
    print(f"ResNet-50 v1.5 gradients: {len(arrays)} tensors, {elements:,} elements "
          f"({args.dtype}, {nbytes / 1e6:.1f} MB), median of {args.repeats} runs")
    targets = _print_table(
        f"As in training: fresh gradients, read only by the step (rewritten in place); "
        f"Fill -> step minus the Fill alone ({1e3 * fill:.2f} ms)",
        in_place, nbytes, t[COPY], isas)
    _print_table("Held elsewhere (variable reads): every output a new buffer",
                 {name: t[("held", name)] for name in variant_names}, nbytes, t[COPY], isas)
    print()
    for line in targets:
        print(line + " (as in training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
