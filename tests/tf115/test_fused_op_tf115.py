"""The fused op builds against TensorFlow 1.15 and computes numpy's answer in 1.15's runtime.

The build runs ``tfamp_rewrite.fused_op.build`` with the flags 1.15's own ``tf.sysconfig``
gives (C++11 ABI 0, ``-l:libtensorflow_framework.so.1``; see tf115_sysconfig.py): the CPU
library with g++, the CUDA objects with nvcc when one is found, both against 1.15's
headers. ``TF_LoadLibrary`` then loads them into TensorFlow 1.15.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from cpu_features import ISAS
from fused_op_cases import assert_matches_oracle, poison, random_gradients, random_sizes
from rounding_cases import assert_rounds_like_casts, random_bits, specials_at_every_position
from runtime_process import tf115_process
from tensorflow.core.framework import graph_pb2, kernel_def_pb2, op_def_pb2
from tf115_sysconfig import tf115_build

from tfamp_rewrite.fused_op import build as fused_op_build
from tfamp_rewrite.fused_op import cuda_toolchain
from tfamp_rewrite.fused_op import op as fused_op

OP = "UnscaleAndCheckFinite"
ROUND_OP = "RoundToHalf"
_DATATYPE = {np.dtype(np.float32): 1, np.dtype(np.float16): 19}
_HALF_DATATYPE = {"float16": 19, "bfloat16": 14}


@pytest.fixture(scope="module")
def tensorflow_115(tf115_tree, tf115):
    return tf115_build(tf115_tree, tf115)


@pytest.fixture(scope="module")
def libraries(tensorflow_115):
    return fused_op_build.build_libraries(tensorflow=tensorflow_115)


@pytest.fixture(scope="module")
def tf115_with_op(tf115, libraries):
    """The session's 1.15 runtime with the CPU library loaded."""
    ops = op_def_pb2.OpList.FromString(tf115.load_library(libraries.cpu))
    assert sorted(op.name for op in ops.op) == [ROUND_OP, OP]
    return tf115


def unscale_graph(dtypes):
    """Placeholders ``g<i>`` and ``inv_scale`` feeding one UnscaleAndCheckFinite node."""
    graph = graph_pb2.GraphDef()
    for i, dtype in enumerate(list(dtypes) + [np.float32]):
        node = graph.node.add()
        node.name, node.op = ("g%d" % i if i < len(dtypes) else "inv_scale"), "Placeholder"
        node.attr["dtype"].type = _DATATYPE[np.dtype(dtype)]
    node = graph.node.add()
    node.name, node.op = "unscale", OP
    node.input.extend(["g%d" % i for i in range(len(dtypes))] + ["inv_scale"])
    node.attr["T"].list.type.extend(_DATATYPE[np.dtype(d)] for d in dtypes)
    return graph.SerializeToString()


def run_in(runtime, arrays, inv_scale):
    feeds = {"g%d:0" % i: a for i, a in enumerate(arrays)}
    feeds["inv_scale:0"] = np.float32(inv_scale)
    fetches = ["unscale:%d" % i for i in range(len(arrays) + 1)]
    values = runtime.run(unscale_graph([a.dtype for a in arrays]), feeds, fetches)
    return values[:-1], bool(values[-1])


def test_flags_are_tf115s_own(tensorflow_115, tf115_tree, libraries, verified):
    assert tensorflow_115.compile_flags == ["-I%s" % tf115_tree.include, "-D_GLIBCXX_USE_CXX11_ABI=0"]
    assert tensorflow_115.link_flags == ["-L%s" % tf115_tree.core, "-l:libtensorflow_framework.so.1"]
    _, compile_flags, _ = fused_op_build._tensorflow_flags(tensorflow_115)
    assert "-std=c++14" in compile_flags  # g++ 12's C++17 default would not load into 1.15
    assert libraries.cpu.is_file() and libraries.directory.name.startswith("tf1.15.")
    verified("fused op", "built against TF 1.15's headers, flags from 1.15's own tf.sysconfig code: "
             "%s %s; in %s" % (" ".join(f for f in compile_flags if not f.startswith("-isystem")),
                               " ".join(tensorflow_115.link_flags[1:]), libraries.directory))


def test_cuda_objects_compile_against_tf115(libraries, verified):
    toolchain = cuda_toolchain.find_cuda_toolchain()
    if toolchain is None:
        pytest.skip("no nvcc on this machine: the GPU library is legitimately not built")
    assert libraries.gpu_error is None and libraries.gpu is not None, libraries.gpu_error
    archs = ", sm_".join(map(str, cuda_toolchain.target_archs(toolchain)))
    verified("fused op", "CUDA objects (gpu_kernel.cc, gpu_launch.cu) compiled against TF 1.15's "
             "headers with nvcc %s for sm_%s" % (toolchain.version, archs))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("poisoned", [False, True], ids=["finite", "inf_nan"])
def test_random_float32_float16_lists_match_numpy_in_tf115(tf115_with_op, seed, poisoned, verified):
    rng = np.random.default_rng(seed)
    arrays = random_gradients(rng, random_sizes(rng, 40, num_big=1), dtypes=(np.float16, np.float32))
    if poisoned:
        arrays = poison(rng, arrays)
    inv_scale = 2.0 ** -int(rng.integers(1, 16))
    unscaled, all_finite = run_in(tf115_with_op, arrays, inv_scale)
    assert all_finite is not poisoned
    assert_matches_oracle(unscaled, all_finite, arrays, inv_scale)
    if seed == 1 and poisoned:
        verified("fused op", "UnscaleAndCheckFinite in TF 1.15 (TF_LoadLibrary): bit-exact to numpy "
                 "on random float32/float16 lists, 40 tensors up to 4 M elements, inf/nan injected")


@pytest.fixture(params=ISAS)
def cpu_isa(request, tf115_with_op, libraries):
    """The CPU kernel capped at one instruction-set path in 1.15 (paths this CPU lacks skip);
    a cap already in the environment (``make test-avx2``) counts as the CPU's limit."""
    def selected():
        return tf115_with_op.library_string(libraries.cpu, "TfampUnscaleCpuIsa")

    initial = os.environ.get(fused_op.CPU_ISA_ENV)
    best = selected()
    if ISAS.index(request.param) > ISAS.index(best):
        pytest.skip("this CPU has no %s path (its best is %s)" % (request.param, best))
    tf115_with_op.set_environment(fused_op.CPU_ISA_ENV, request.param)
    try:
        assert selected() == request.param
        yield request.param
    finally:
        tf115_with_op.set_environment(fused_op.CPU_ISA_ENV, initial)


@pytest.mark.parametrize("inv_scale", [1 / 3, 2.0 ** -10, 65536.0])
def test_every_float16_pattern_rounds_like_numpy_in_tf115(tf115_with_op, cpu_isa, inv_scale, verified):
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # inf, nan, subnormals included
    arrays = [every, every.astype(np.float32)]
    unscaled, all_finite = run_in(tf115_with_op, arrays, inv_scale)
    assert all_finite is False
    assert_matches_oracle(unscaled, all_finite, arrays, inv_scale)
    if inv_scale == 65536.0:
        verified("fused op", "UnscaleAndCheckFinite in TF 1.15 (TF_LoadLibrary), CPU path %s: "
                 "bit-exact to numpy on all 65536 float16 patterns" % cpu_isa)


def rounding_graph(half, count):
    """Placeholders ``x<i>``, each read by TF 1.15's Cast pair ``widen<i>`` and ``round<i>``."""
    graph = graph_pb2.GraphDef()
    for i in range(count):
        x = graph.node.add(name="x%d" % i, op="Placeholder")
        x.attr["dtype"].type = _DATATYPE[np.dtype(np.float32)]
        for name, op, source, src, dst in (("narrow", "Cast", "x", 1, _HALF_DATATYPE[half]),
                                           ("widen", "Cast", "narrow", _HALF_DATATYPE[half], 1)):
            cast = graph.node.add(name="%s%d" % (name, i), op=op, input=["%s%d" % (source, i)])
            cast.attr["SrcT"].type, cast.attr["DstT"].type = src, dst
        rounding = graph.node.add(name="round%d" % i, op=ROUND_OP, input=["x%d" % i])
        rounding.attr["half_type"].type = _HALF_DATATYPE[half]
    return graph.SerializeToString()


@pytest.mark.parametrize("half", sorted(_HALF_DATATYPE))
def test_rounding_op_is_tf115s_cast_pair(tf115_with_op, cpu_isa, half, verified):
    """RoundToHalf in 1.15 against 1.15's own Cast(Cast(x, half), float32), bit for bit."""
    tensors = specials_at_every_position((1, 7, 8, 9, 16, 17))
    tensors.append(random_bits(np.random.default_rng(3), 1 << 20))
    feeds = {"x%d:0" % i: bits.view(np.float32) for i, bits in enumerate(tensors)}
    fetches = [name % i for i in range(len(tensors)) for name in ("widen%d:0", "round%d:0")]
    values = tf115_with_op.run(rounding_graph(half, len(tensors)), feeds, fetches)
    for bits, want, got in zip(tensors, values[0::2], values[1::2]):
        assert_rounds_like_casts(bits, want, got, half)
    verified("fused op", "RoundToHalf(%s) in TF 1.15, CPU path %s: bit-exact to 1.15's Cast pair on special "
             "values at every lane and tail position and 2^20 random float32 patterns" % (half, cpu_isa))


def test_gpu_library_registers_both_kernels_in_tf115(tf115_tree, libraries):
    if libraries.gpu is None:
        pytest.skip("no GPU library: %s" % (libraries.gpu_skipped or libraries.gpu_error))
    with tf115_process(tf115_tree) as fresh:  # an op is registered once per process
        fresh.load_library(libraries.gpu)
        kernels = kernel_def_pb2.KernelList.FromString(fresh.registered_kernels(OP))
        assert sorted(kernel.device_type for kernel in kernels.kernel) == ["CPU", "GPU"]
        arrays = [np.array([1.0, np.inf], np.float32), np.array([4.0, -6.0], np.float16)]
        unscaled, all_finite = run_in(fresh, arrays, 0.5)
    assert_matches_oracle(unscaled, all_finite, arrays, 0.5)
