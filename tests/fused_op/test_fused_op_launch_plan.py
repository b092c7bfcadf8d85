"""The op's work partitioning (launch_plan.h), compiled for the host and checked from Python.

The CUDA kernel runs one block per LaunchTable entry; the CPU kernel one work item per
ChunkIndex chunk. Both must cover every element of every tensor exactly once, including
tensors split across launches, and the planner must not open a launch it does not need.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import BENCHMARKS

from tfamp_rewrite.fused_op import build as fused_op_build

MAX_TENSORS, MAX_BLOCKS, GPU_CHUNK = 96, 320, 65536  # launch_plan.h
I64P = ctypes.POINTER(ctypes.c_int64)
I32P = ctypes.POINTER(ctypes.c_int32)


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    """launch_plan.cc plus a C shim, built as strict C++11 (the TF 1.15 dialect)."""
    src = fused_op_build.op_source_dir()
    library = tmp_path_factory.mktemp("planner") / "libfused_op_plan.so"
    subprocess.run(
        [os.environ.get("CXX", "g++"), "-std=c++11", "-O1", "-Wall", "-Wextra", "-Werror",
         "-shared", "-fPIC", "-I", str(src), str(src / "launch_plan.cc"),
         str(Path(__file__).with_name("fused_op_plan_capi.cc")), "-o", str(library)],
        check=True,
    )
    lib = ctypes.CDLL(str(library))
    lib.tfamp_test_plan_launches.restype = ctypes.c_int64
    lib.tfamp_test_plan_launches.argtypes = [I64P, I32P, ctypes.c_int, ctypes.c_int64,
                                             ctypes.c_int, ctypes.c_int, I64P, ctypes.c_int64]
    lib.tfamp_test_cpu_chunks.restype = ctypes.c_int64
    lib.tfamp_test_cpu_chunks.argtypes = [I64P, ctypes.c_int, ctypes.c_int64, I64P,
                                          ctypes.c_int64]
    return lib


def _as_c(array, ctype):
    return array.ctypes.data_as(ctypes.POINTER(ctype))


def plan_launches(planner, sizes, types, chunk, max_tensors, max_blocks):
    """[(slots [(tensor, size, type, out_ok)], blocks int64[k, 3] of (slot, begin, end))]."""
    sizes = np.asarray(sizes, np.int64)
    types = np.asarray(types, np.int32)
    chunks = int(((sizes + chunk - 1) // chunk).sum())
    out = np.empty(9 * (chunks + len(sizes)) + 16, np.int64)
    n = planner.tfamp_test_plan_launches(_as_c(sizes, ctypes.c_int64), _as_c(types, ctypes.c_int32),
                                         len(sizes), chunk, max_tensors, max_blocks,
                                         _as_c(out, ctypes.c_int64), out.size)
    assert n >= 0
    launches, i = [], 0
    while i < n:
        num_tensors, num_blocks = int(out[i]), int(out[i + 1])
        i += 2
        slots = [tuple(int(x) for x in out[i + 4 * s:i + 4 * s + 4]) for s in range(num_tensors)]
        i += 4 * num_tensors
        launches.append((slots, out[i:i + 3 * num_blocks].reshape(num_blocks, 3)))
        i += 3 * num_blocks
    return launches


def assert_covers_each_element_once(tensor_of_block, begins, ends, sizes):
    """Blocks in tensor order tile every tensor's [0, size) with no gap and no overlap."""
    sizes = np.asarray(sizes, np.int64)
    assert np.all(begins < ends)
    same_tensor = tensor_of_block[1:] == tensor_of_block[:-1]
    assert np.all(tensor_of_block[1:] >= tensor_of_block[:-1])
    assert np.all(begins[1:][same_tensor] == ends[:-1][same_tensor])
    first = np.r_[True, ~same_tensor]
    last = np.r_[~same_tensor, True]
    assert np.all(begins[first] == 0)
    assert np.all(ends[last] == sizes[tensor_of_block[last]])
    assert sorted(set(tensor_of_block.tolist())) == np.flatnonzero(sizes).tolist()


def check_plan(planner, sizes, chunk, max_tensors, max_blocks, rng):
    types = rng.integers(0, 3, len(sizes))
    launches = plan_launches(planner, sizes, types, chunk, max_tensors, max_blocks)
    tensor_of_block, begins, ends = [], [], []
    for number, (slots, blocks) in enumerate(launches):
        assert 1 <= len(slots) <= max_tensors and 1 <= len(blocks) <= max_blocks
        assert sorted(set(blocks[:, 0].tolist())) == list(range(len(slots)))  # no idle slot
        for tensor, size, element_type, out_ok in slots:
            assert (size, element_type, out_ok) == (sizes[tensor], types[tensor], 1)
        if number < len(launches) - 1:  # a launch is closed only when it is full
            assert len(blocks) == max_blocks or len(slots) == max_tensors
        slot_tensor = np.array([s[0] for s in slots], np.int64)
        tensor_of_block.append(slot_tensor[blocks[:, 0]])
        begins.append(blocks[:, 1])
        ends.append(blocks[:, 2])
    if not launches:
        assert not any(sizes)
        return launches
    assert_covers_each_element_once(np.concatenate(tensor_of_block), np.concatenate(begins),
                                    np.concatenate(ends), sizes)
    return launches


def random_size_mix(rng, chunk):
    count = int(rng.integers(1, 200))
    kind = rng.integers(4)
    if kind == 0:  # around chunk multiples: exact fits and off-by-ones
        sizes = rng.integers(0, 5, count) * chunk + rng.integers(-1, 2, count)
    elif kind == 1:  # many tiny tensors
        sizes = rng.integers(0, 3, count)
    else:  # log-uniform up to ~20 chunks
        sizes = np.exp(rng.uniform(0, np.log(20 * chunk + 2), count)).astype(np.int64)
    sizes = np.maximum(sizes, 0)
    sizes[rng.random(count) < 0.1] = 0
    return sizes.tolist()


def test_thousands_of_random_mixes_cover_every_element_once(planner):
    rng = np.random.default_rng(2024)
    for _ in range(2000):
        chunk = int(rng.choice([1, 2, 3, 7, 64, 1000]))
        check_plan(planner, random_size_mix(rng, chunk), chunk,
                   int(rng.choice([1, 2, 3, 5, MAX_TENSORS])),
                   int(rng.choice([1, 2, 4, 7, MAX_BLOCKS])), rng)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=30),
       chunk=st.integers(1, 9), max_tensors=st.integers(1, 6), max_blocks=st.integers(1, 8))
def test_planner_properties_on_small_lists(planner, sizes, chunk, max_tensors, max_blocks):
    check_plan(planner, sizes, chunk, max_tensors, max_blocks, np.random.default_rng(0))


def test_real_limits_split_big_tensors_across_launches(planner):
    rng = np.random.default_rng(5)
    sizes = [5 * MAX_BLOCKS * GPU_CHUNK + 3, 1, 0, 2 * GPU_CHUNK, MAX_BLOCKS * GPU_CHUNK]
    launches = check_plan(planner, sizes, GPU_CHUNK, MAX_TENSORS, MAX_BLOCKS, rng)
    # 1601 chunks of tensor 0 fill five launches; the sixth starts with its last chunk.
    assert [len(slots) for slots, _ in launches] == [1, 1, 1, 1, 1, 4, 1]
    assert [len(blocks) for _, blocks in launches] == [MAX_BLOCKS] * 6 + [4]
    for _ in range(30):  # 1-500 tensors of up to several million elements
        sizes = rng.integers(0, 6_000_000, int(rng.integers(1, 500))) // rng.integers(1, 1000)
        check_plan(planner, sizes.tolist(), GPU_CHUNK, MAX_TENSORS, MAX_BLOCKS, rng)


def resnet50_sizes():
    """ResNet-50 v1.5's variable sizes, from the benchmark that measures the op on them."""
    path = Path(BENCHMARKS) / "unscale_op.py"
    spec = importlib.util.spec_from_file_location("unscale_op_benchmark", str(path))
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    return [int(np.prod(s)) for s in benchmark.resnet50_v15_variable_shapes()]


def test_resnet50_needs_a_handful_of_launches(planner):
    sizes = resnet50_sizes()
    assert (len(sizes), sum(sizes)) == (161, 25_557_032)  # the published parameter count
    launches = check_plan(planner, sizes, GPU_CHUNK, MAX_TENSORS, MAX_BLOCKS,
                          np.random.default_rng(0))
    assert len(launches) <= 3


@pytest.mark.parametrize("chunk", [1, 3, 32768])
def test_cpu_chunks_cover_every_element_once(planner, chunk):
    rng = np.random.default_rng(chunk)
    for _ in range(200):
        sizes = np.asarray(random_size_mix(rng, chunk), np.int64)
        capacity = int(((sizes + chunk - 1) // chunk).sum())
        out = np.empty(3 * capacity + 3, np.int64)
        n = planner.tfamp_test_cpu_chunks(_as_c(sizes, ctypes.c_int64), len(sizes), chunk,
                                          _as_c(out, ctypes.c_int64), capacity)
        assert n == capacity
        items = out[:3 * n].reshape(n, 3)
        if n:
            assert_covers_each_element_once(items[:, 0], items[:, 1], items[:, 2], sizes)
