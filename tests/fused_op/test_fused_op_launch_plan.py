"""The op's work partitioning (launch_plan.h), compiled for the host and checked from Python.

The CUDA kernel runs one block per chunk of a launch's elements, walking the tensors the
chunk overlaps (ForEachPartOfBlock, the kernel's own loop); the CPU kernel one work item per
ChunkIndex chunk. Both must cover every element of every tensor exactly once; the planner
must not open a launch it does not need, and only a launch's last block may be partly idle.
"""
from __future__ import annotations

import collections
import ctypes
import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_gradients import MODELS, model_sizes
from repo_paths import BENCHMARKS

from tfamp_rewrite.fused_op import build as fused_op_build

I64P = ctypes.POINTER(ctypes.c_int64)
MAX_ELEMENTS_PER_LAUNCH = 2**30 - 1  # launch_plan.h: kMaxElementsPerLaunch
I32P = ctypes.POINTER(ctypes.c_int32)
Limits = collections.namedtuple("Limits", "small_table large_table chunk")


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
    lib.tfamp_test_plan_limits.argtypes = [ctypes.POINTER(ctypes.c_int),
                                           ctypes.POINTER(ctypes.c_int), I64P]
    lib.tfamp_test_needs_large_tables.argtypes = [I64P, ctypes.c_int, ctypes.c_int]
    lib.tfamp_test_plan_launches.restype = ctypes.c_int64
    lib.tfamp_test_plan_launches.argtypes = [I64P, I32P, ctypes.c_int, ctypes.c_int64,
                                             ctypes.c_int, ctypes.c_int, I64P, ctypes.c_int64]
    lib.tfamp_test_cpu_chunks.restype = ctypes.c_int64
    lib.tfamp_test_cpu_chunks.argtypes = [I64P, ctypes.c_int, ctypes.c_int64, I64P,
                                          ctypes.c_int64]
    small, large, chunk = ctypes.c_int(), ctypes.c_int(), ctypes.c_int64()
    lib.tfamp_test_plan_limits(small, large, chunk)
    lib.limits = Limits(small.value, large.value, chunk.value)
    return lib


@pytest.fixture(scope="module")
def limits(planner):
    """The two launch tables' capacities (tensors per launch) and the elements per block, as
    launch_plan.h sets them."""
    return planner.limits


def _as_c(array, ctype):
    return array.ctypes.data_as(ctypes.POINTER(ctype))


class Plan(collections.namedtuple("Plan", "launches slots parts")):
    """A plan as arrays over all launches:
    launches int64[L, 3]: (num_tensors, num_blocks, chunk_elements)
    slots    int64[S, 7]: (launch, tensor, first, size, type, out_ok, offset in the tensor)
    parts    int64[P, 5]: (launch, block, slot, begin, end), in the order blocks walk them"""

    __slots__ = ()

    def parts_of(self, launch):
        return self.parts[self.parts[:, 0] == launch][:, 1:]


def plan_launches(planner, sizes, types, chunk, max_tensors, table_slots=None) -> Plan:
    """PlanLaunches in tables of ``table_slots`` (default: the small table when it holds
    ``max_tensors``, else the large one)."""
    if table_slots is None:
        small, large, _ = planner.limits
        table_slots = small if max_tensors <= small else large
    sizes = np.asarray(sizes, np.int64)
    types = np.asarray(types, np.int32)
    blocks = int(((sizes + chunk - 1) // chunk).sum()) + len(sizes)  # bounds blocks and launches
    slots = len(sizes) + 16 + int(sizes.sum()) // MAX_ELEMENTS_PER_LAUNCH  # pieces included
    out = np.empty(4 * len(sizes) + 6 * slots + 4 * (blocks + slots) + 16, np.int64)
    n = planner.tfamp_test_plan_launches(_as_c(sizes, ctypes.c_int64), _as_c(types, ctypes.c_int32),
                                         len(sizes), chunk, max_tensors, table_slots,
                                         _as_c(out, ctypes.c_int64), out.size)
    assert n >= 0
    launches, slots, parts, i = [], [], [], 0
    while i < n:
        num_tensors, num_blocks, launch_chunk, num_parts = (int(v) for v in out[i:i + 4])
        number = len(launches)
        launches.append((num_tensors, num_blocks, launch_chunk))
        i += 4
        slots.append(np.c_[np.full(num_tensors, number),
                           out[i:i + 6 * num_tensors].reshape(num_tensors, 6)])
        i += 6 * num_tensors
        parts.append(np.c_[np.full(num_parts, number), out[i:i + 4 * num_parts].reshape(num_parts, 4)])
        i += 4 * num_parts
    if not launches:
        return Plan(np.zeros((0, 3), np.int64), np.zeros((0, 7), np.int64),
                    np.zeros((0, 5), np.int64))
    return Plan(np.array(launches, np.int64), np.concatenate(slots), np.concatenate(parts))


def assert_covers_each_element_once(tensor_of_part, begins, ends, sizes):
    """Parts in tensor order tile every non-empty tensor's [0, size), no gap, no overlap."""
    sizes = np.asarray(sizes, np.int64)
    assert np.all(begins < ends)
    same_tensor = tensor_of_part[1:] == tensor_of_part[:-1]
    assert np.all(tensor_of_part[1:] >= tensor_of_part[:-1])
    assert np.all(begins[1:][same_tensor] == ends[:-1][same_tensor])
    first = np.r_[True, ~same_tensor]
    last = np.r_[~same_tensor, True]
    assert np.all(begins[first] == 0)
    assert np.all(ends[last] == sizes[tensor_of_part[last]])
    assert sorted(set(tensor_of_part.tolist())) == np.flatnonzero(sizes).tolist()


def check_plan(planner, sizes, chunk, max_tensors, rng, table_slots=None) -> Plan:
    """Every property of a plan, checked over all its launches at once; returns it."""
    sizes = np.asarray(sizes, np.int64)
    types = rng.integers(0, 3, len(sizes))
    plan = plan_launches(planner, sizes, types, chunk, max_tensors, table_slots)
    num_tensors, num_blocks, chunks = plan.launches.T
    assert len(plan.launches) == -(-int(np.count_nonzero(sizes)) // max_tensors)
    if not len(plan.launches):
        return plan
    assert np.all(chunks == chunk) and np.all((num_tensors >= 1) & (num_tensors <= max_tensors))
    assert np.all(num_tensors[:-1] == max_tensors)  # a launch is closed only when it is full
    # Slots: the non-empty tensors in order, each once, back to back within a launch.
    launch, tensor, first, size, element_type, out_ok, offset = plan.slots.T
    assert np.array_equal(tensor, np.flatnonzero(sizes)) and not offset.any()
    assert np.array_equal(size, sizes[tensor]) and np.array_equal(element_type, types[tensor])
    assert np.all(out_ok == 1)
    slot_end = np.cumsum(size)
    launch_start = np.r_[0, np.flatnonzero(np.diff(launch)) + 1]
    base = (slot_end - size)[launch_start][launch]
    assert np.array_equal(first, slot_end - size - base)
    totals = np.bincount(launch, weights=size).astype(np.int64)
    assert np.array_equal(num_blocks, -(-totals // chunk))  # ceil: only the last block is short
    # Parts: blocks 0..num_blocks-1 of each launch in order, each a run of consecutive slots
    # holding exactly the block's share of the launch's elements.
    launch, block, slot, begin, end = plan.parts.T
    key = np.cumsum(np.r_[0, num_blocks[:-1]])[launch] + block  # global block number
    assert key[0] == 0 and np.all(np.diff(key) >= 0) and np.all(np.diff(key) <= 1)
    assert key[-1] == num_blocks.sum() - 1
    same_block = key[1:] == key[:-1]
    assert np.all(slot[1:][same_block] == slot[:-1][same_block] + 1)
    in_block = np.bincount(key, weights=end - begin).astype(np.int64)
    block_of_key = np.arange(len(in_block)) - np.repeat(np.cumsum(np.r_[0, num_blocks[:-1]]),
                                                         num_blocks)
    assert np.array_equal(in_block, np.minimum(chunk, np.repeat(totals, num_blocks) -
                                               chunk * block_of_key))
    tensor_of_part = plan.slots[launch_start[launch] + slot, 1]
    assert_covers_each_element_once(tensor_of_part, begin, end, sizes)
    return plan


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


def test_thousands_of_random_mixes_cover_every_element_once(planner, limits):
    rng = np.random.default_rng(2024)
    for _ in range(2000):
        chunk = int(rng.choice([1, 2, 3, 7, 64, 1000]))
        check_plan(planner, random_size_mix(rng, chunk), chunk,
                   int(rng.choice([1, 2, 3, 5, limits.small_table, limits.large_table])), rng)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=30),
       chunk=st.integers(1, 9), max_tensors=st.integers(1, 6))
def test_planner_properties_on_small_lists(planner, sizes, chunk, max_tensors):
    check_plan(planner, sizes, chunk, max_tensors, np.random.default_rng(0))


def test_small_tensors_share_blocks_and_big_ones_stay_in_one_launch(planner, limits):
    max_tensors, chunk = limits.small_table, limits.chunk
    plan = check_plan(planner, [10] * 100 + [0, 1], chunk, max_tensors, np.random.default_rng(1))
    assert plan.launches[:, 1].tolist() == [1]
    assert len(plan.parts) == 101  # one block walks all 101 tensors
    huge = 5000 * chunk + 3
    plan = check_plan(planner, [huge, 1, 0, 2 * chunk], chunk, max_tensors,
                      np.random.default_rng(2))
    assert plan.launches[:, 1].tolist() == [5003]
    # The block holding the huge tensor's end also holds the next two tensors.
    parts = plan.parts_of(0)
    assert parts[parts[:, 0] == 5000][:, 1].tolist() == [0, 1, 2]


def test_tensors_beyond_a_launchs_elements_are_cut_into_pieces(planner, limits):
    """A launch holds fewer than 2^30 elements (30 bits per slot start): a bigger list spans
    launches, a bigger tensor is cut into slots whose pointers advance by the elements before
    them; every element is still covered once, in order."""
    max_tensors = limits.small_table
    chunk = 2**24
    sizes = np.array([MAX_ELEMENTS_PER_LAUNCH + 5, 3, 2**31, 7], np.int64)
    types = np.array([0, 1, 2, 0], np.int32)
    plan = plan_launches(planner, sizes, types, chunk, max_tensors)
    launch, tensor, first, size, element_type, out_ok, offset = plan.slots.T
    totals = np.bincount(launch, weights=size).astype(np.int64)
    assert np.all(totals <= MAX_ELEMENTS_PER_LAUNCH)
    assert np.all(totals[:-1] == MAX_ELEMENTS_PER_LAUNCH)  # closed only when full
    assert np.all(out_ok == 1) and np.array_equal(element_type, types[tensor])
    for t, n in enumerate(sizes):
        pieces = tensor == t
        assert np.array_equal(offset[pieces], np.r_[0, np.cumsum(size[pieces])[:-1]])
        assert size[pieces].sum() == n
    assert np.array_equal(plan.launches[:, 1], -(-totals // chunk))
    launch_of_part, block, slot, begin, end = plan.parts.T
    launch_start = np.r_[0, np.flatnonzero(np.diff(launch)) + 1]
    rows = launch_start[launch_of_part] + slot
    assert_covers_each_element_once(tensor[rows], begin + offset[rows], end + offset[rows],
                                    sizes)


@pytest.mark.parametrize("table", ["small_table", "large_table"])
def test_long_lists_need_one_launch_per_table_of_tensors(planner, limits, table):
    max_tensors, chunk = getattr(limits, table), limits.chunk
    rng = np.random.default_rng(5)
    for _ in range(20):  # up to 4000 tensors of up to several million elements
        sizes = rng.integers(0, 6_000_000, int(rng.integers(1, 4000))) // rng.integers(1, 1000)
        check_plan(planner, sizes.tolist(), chunk, max_tensors, rng)


def test_the_table_size_changes_the_capacity_not_the_plan(planner, limits):
    """Planned at the same tensors per launch, both tables hold the same slots and parts."""
    rng = np.random.default_rng(8)
    for max_tensors in (1, 7, limits.small_table):
        sizes = random_size_mix(rng, 64)
        types = rng.integers(0, 3, len(sizes))
        small, large = (plan_launches(planner, sizes, types, 64, max_tensors, table)
                        for table in (limits.small_table, limits.large_table))
        for a, b in zip(small, large):
            assert np.array_equal(a, b)


def test_the_large_table_is_needed_past_the_small_ones_capacity(planner, limits):
    """Only lists with more non-empty tensors than a small table holds, and launches allowed
    more than it holds, need the large table."""
    small = limits.small_table

    def needs_large(sizes, max_tensors):
        sizes = np.asarray(sizes, np.int64)
        return bool(planner.tfamp_test_needs_large_tables(_as_c(sizes, ctypes.c_int64),
                                                          len(sizes), max_tensors))

    assert not needs_large([1] * small, limits.large_table)
    assert needs_large([1] * (small + 1), limits.large_table)
    assert not needs_large([1] * small + [0] * 50, limits.large_table)
    assert not needs_large([1] * 1000, small)
    assert needs_large([1] * 1000, small + 1)


def test_model_sizes_match_the_benchmarks_resnet50():
    """The GPU harness's ResNet-50 is the one benchmarks/unscale_op.py measures on the CPU."""
    path = Path(BENCHMARKS) / "unscale_op.py"
    spec = importlib.util.spec_from_file_location("unscale_op_benchmark", str(path))
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    sizes = [int(np.prod(s)) for s in benchmark.resnet50_v15_variable_shapes()]
    assert sizes == model_sizes("resnet50")
    assert (len(sizes), sum(sizes)) == (161, 25_557_032)  # the published parameter count
    assert (len(model_sizes("bert_base")), sum(model_sizes("bert_base"))) == (199, 109_482_240)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("table", ["small_table", "large_table"])
def test_real_models_need_few_launches_and_waste_under_a_tenth_of_their_blocks(
        planner, limits, model, table):
    """Tail waste: block capacity (blocks x chunk) that holds no element. With the large
    table every model here takes one launch."""
    max_tensors, chunk = getattr(limits, table), limits.chunk
    sizes = model_sizes(model)
    plan = check_plan(planner, sizes, chunk, max_tensors, np.random.default_rng(0))
    assert len(plan.launches) == -(-len(sizes) // max_tensors)
    blocks = int(plan.launches[:, 1].sum())
    assert 1 - sum(sizes) / (blocks * chunk) < 0.1
    # A block per tensor's last partial chunk, as a per-tensor planner makes, wastes more:
    per_tensor_blocks = sum(-(-s // chunk) for s in sizes)
    assert blocks < per_tensor_blocks


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
