"""RoundToHalf vs TensorFlow's Cast pair, the rounding of emulated Tensor Core numerics, per N floats.

    python benchmarks/round_op.py [--repeats 30] [--sizes 65536,1048576,4194304,16777216]

Emulation (graph_rewrite/emulation.py) rounds every half tensor to half and back in
float32.  Stock TensorFlow does it with two Casts, ``Cast(Cast(x, float16), float32)``;
where the op library loads, sessions and ``--validate`` use one ``RoundToHalf`` node
(graph_rewrite/rounding.py).  Both give the same bits; this times them side by side in
one process, for float16 and bfloat16, on each CPU path of the op this CPU has
(AVX-512, AVX2 + F16C -- an AVX2-only machine's --, scalar; one Session per path, as a
kernel picks its path when its session constructs it), with a float32 ``Mul`` (one
elementwise pass of TensorFlow's) as the yardstick.

The values are log-uniform in magnitude over 2^-30 .. 2^17 with random signs, so
conversions meet subnormal, normal and overflowing values unpredictably, as gradients do.
Two ways the rounding meets its input, one table each:

* **in place** (emulation's case): the input is a fresh buffer nothing else reads -- an
  emulated node's float32 output -- so RoundToHalf (and Mul) write into it.  Made here by
  ``x + 0`` of a variable; the time is that of ``add -> rounding`` minus ``add`` alone.
* **new buffer**: the input is a variable's value, so every output is a new buffer.

Grappler and the classic graph optimizer are off (they could fold or merge the Casts).
Times are medians of interleaved runs; read the ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from tfamp_rewrite.fused_op import op as fused_op
from tfamp_rewrite.fused_op import round_to_half as rounding

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, "..", "tests", "support")]  # also when imported by path
from cpu_features import ISAS, describe_cpu  # noqa: E402
from cpu_path_sessions import runs_per_cpu_path  # noqa: E402

_tf = tf.compat.v1
HALF_TYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16}
CASTS = "Cast pair"
MUL = "Mul (1 pass)"
SCENARIOS = {"in_place": "in place (emulation's case)", "new_buffer": "new buffer (input held elsewhere)"}


def random_values(rng, size):
    magnitudes = np.exp2(rng.uniform(-30, 17, size))
    return (magnitudes * rng.choice([-1.0, 1.0], size)).astype(np.float32)


def build(values, half, module):
    """The graph: per scenario, a target per variant (and the source alone, for in place)."""
    graph = tf.Graph()
    with graph.as_default():
        variable = tf.Variable(values)
        sources = {"in_place": variable.read_value() + 0.0, "new_buffer": variable.read_value()}
        targets = {("in_place", "source"): sources["in_place"].op}
        for scenario, x in sources.items():
            with tf.control_dependencies([x]):  # the rounding starts once its input is there
                x = tf.identity(x)
            targets[(scenario, CASTS)] = tf.cast(tf.cast(x, HALF_TYPES[half]), tf.float32).op
            targets[(scenario, "op")] = module.round_to_half(x, half_type=HALF_TYPES[half]).op
            targets[(scenario, MUL)] = tf.multiply(x, 1.0001).op
        init = _tf.global_variables_initializer()
    return graph, init, targets


def runs(values, half, module, isas):
    """``{(scenario, variant): callable}``; RoundToHalf once per CPU path (its own Session)."""
    graph, init, targets = build(values, half, module)
    return runs_per_cpu_path(graph, targets, "op", "RoundToHalf ", isas, lambda session: session.run(init))


def median_times(calls, repeats):
    """Median seconds of each call, interleaved so that drift hits all alike."""
    for call in calls.values():
        call()
    samples = {key: [] for key in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            samples[key].append(time.perf_counter() - start)
    return {key: statistics.median(times) for key, times in samples.items()}


def table(half, sizes, isas, repeats, module, rng):
    variants = [CASTS] + ["RoundToHalf " + isa for isa in isas] + [MUL]
    lines = []
    for scenario, title in SCENARIOS.items():
        lines.append("%s, %s: ms per call (Cast pair / variant: x faster)" % (half, title))
        lines.append("%12s" % "floats" + "".join("%24s" % v for v in variants))
        for size in sizes:
            sessions, calls = runs(random_values(rng, size), half, module, isas)
            times = median_times({k: c for k, c in calls.items() if k[0] == scenario}, repeats)
            for session in sessions:
                session.close()
            base = times.get((scenario, "source"), 0.0)
            net = {v: times[(scenario, v)] - base for v in variants}
            lines.append("%12d" % size + "".join(_cell(net[v], net[CASTS], v != CASTS) for v in variants))
        lines.append("")
    return "\n".join(lines)


def _cell(seconds, casts, with_ratio):
    """``ms (Cast pair / this)``; under a microsecond (the subtraction's noise) is not shown."""
    if seconds < 1e-6:
        return "%10s%12s  " % ("< 0.001", "")
    ratio = "(%.2fx)" % (casts / seconds) if with_ratio and casts >= 1e-6 else ""
    return "%10.3f%12s  " % (1e3 * seconds, ratio)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sizes", default="65536,1048576,4194304,16777216")
    args = parser.parse_args(argv)
    if not rounding.round_to_half_available():
        print("RoundToHalf is unavailable here (see the log above); nothing to compare.")
        return 1
    module = fused_op.loader().load()
    best = fused_op.cpu_kernel_isa()
    isas = [isa for isa in reversed(ISAS) if ISAS.index(isa) <= ISAS.index(best)]
    sizes = [int(s) for s in args.sizes.split(",")]
    print("CPU: %s; intra-op threads: TensorFlow's default; %d interleaved repeats"
          % (describe_cpu(), args.repeats))
    rng = np.random.default_rng(0)
    for half in HALF_TYPES:
        print(table(half, sizes, isas, args.repeats, module, rng))
    return 0


if __name__ == "__main__":
    sys.exit(main())
