"""The CUDA kernel itself (gpu_launch.cu, compiled unchanged as C++) run on a CPU grid emulation.

Every thread of every block runs, one at a time, in a shuffled order
(tests/gpu/emulation/cuda_runtime.h), through the op's real launch sequence
(PlanLaunches + EnqueueUnscaleAndCheckFinite). The cases are the CPU kernel's
(test_fused_op.py, same generators), in aligned, misaligned and in-place buffers, with small
chunks and short launch tables as well, so that blocks span tensors and lists span launches.
tests/gpu/device_check.py checks each call: outputs bit-identical to numpy's answer,
all_finite right, every element written exactly once (poisoned outputs, guard bytes, in
place a second write scales twice), inputs of out-of-place calls untouched.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from device_check import LAYOUT_BY_NAME, LAYOUTS, run_checked
from fused_op_cases import DTYPES, SPECIALS, expected, poison, random_gradients, random_sizes
from harness_library import HarnessError, KernelHarness, TensorList
from hypothesis import given, settings
from hypothesis import strategies as st
from model_gradients import MODELS, model_sizes
from unscale_reference import HostTensor, is_nan
from unscale_reference import expected as ieee_expected

LAYOUT_NAMES = [layout.name for layout in LAYOUTS]
# (chunk_elements, max_tensors): the kernel's defaults; blocks spanning many small tensors
# and lists spanning launches; odd chunks that start blocks off the 16-byte grid.
PLAN_SHAPES = [(None, None), (1000, 7), (777, 3), (64, 1)]


def host(arrays):
    return [HostTensor.from_array(a) for a in arrays]


def assert_passes(result):
    if result.problems:
        pytest.fail("the kernel got it wrong:\n" + "\n".join(result.problems), pytrace=False)


@pytest.fixture
def kernel(emulated_kernel):
    emulated_kernel.set_thread_order("shuffled", seed=12345)
    emulated_kernel.set_execute(True)
    emulated_kernel.take_counts()
    return emulated_kernel


# --- the CPU kernel's cases ----------------------------------------------------------------

@pytest.mark.parametrize("seed, layout", [(0, name) for name in LAYOUT_NAMES] +
                         [(1, "misaligned"), (1, "in_place")])
def test_random_lists_match_numpy(kernel, seed, layout):
    """1-500 mixed-dtype tensors of 0 to 40k elements (seed 1: one of 1-4 M), clean and then
    with inf/nan at the first, last and a random element of each."""
    rng = np.random.default_rng(1000 * seed + len(layout))
    arrays = random_gradients(rng, random_sizes(rng, int(rng.integers(1, 501)), num_big=seed))
    inv_scale = float(np.float32(2.0 ** -rng.integers(0, 16) * rng.uniform(0.5, 1.0)))
    clean = run_checked(kernel, host(arrays), inv_scale, LAYOUT_BY_NAME[layout], rng)
    assert_passes(clean)
    with_specials = run_checked(kernel, host(poison(rng, arrays)), inv_scale,
                                LAYOUT_BY_NAME[layout], rng)
    assert_passes(with_specials)
    assert clean.all_finite and not with_specials.all_finite


@pytest.mark.parametrize("chunk, max_tensors", PLAN_SHAPES[1:])
@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_blocks_spanning_tensors_and_lists_spanning_launches(kernel, layout, chunk, max_tensors):
    rng = np.random.default_rng(chunk + max_tensors)
    arrays = poison(rng, random_gradients(rng, random_sizes(rng, 25)))
    result = run_checked(kernel, host(arrays), 0.3, LAYOUT_BY_NAME[layout], rng, chunk,
                         max_tensors)
    assert_passes(result)
    assert result.launches == -(-sum(1 for a in arrays if a.size) // max_tensors)


@pytest.mark.parametrize("position", ["first", "last", "middle"])
def test_one_special_in_a_big_tensor_is_found(kernel, position):
    """As the CPU test, at a tenth of its sizes: the big tensor still spans ~19 blocks."""
    rng = np.random.default_rng(7)
    arrays = random_gradients(rng, [0, 1, 300_001, 17, 250_003], dtypes=(np.float32,))
    arrays[3] = arrays[3].astype(np.float16)
    big = arrays[2]
    big[{"first": 0, "last": big.size - 1, "middle": big.size // 2 + 12345}[position]] = np.nan
    result = run_checked(kernel, host(arrays), 0.125, LAYOUT_BY_NAME["misaligned"], rng)
    assert_passes(result)
    assert not result.all_finite


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=12, max_size=12),
    target=st.integers(0, 11),
    where=st.sampled_from(["first", "last", "random"]),
    special=st.sampled_from(SPECIALS),
    inv_scale=st.floats(2.0 ** -24, 4.0),
    layout=st.sampled_from(LAYOUT_NAMES),
    plan_shape=st.sampled_from(PLAN_SHAPES),
    seed=st.integers(0, 2**16),
)
def test_any_special_anywhere_clears_the_flag(emulated_kernel, sizes, dtypes, target, where,
                                              special, inv_scale, layout, plan_shape, seed):
    rng = np.random.default_rng(seed)
    arrays = [random_gradients(rng, [n], dtypes=(d,))[0] for n, d in zip(sizes, dtypes)]
    poisoned = arrays[target % len(arrays)]
    if poisoned.size:
        index = {"first": 0, "last": poisoned.size - 1}.get(where, seed % poisoned.size)
        poisoned[index] = special
    emulated_kernel.set_thread_order("shuffled", seed=seed)
    result = run_checked(emulated_kernel, host(arrays), float(np.float32(inv_scale)),
                         LAYOUT_BY_NAME[layout], rng, *plan_shape)
    assert_passes(result)
    assert result.all_finite == (poisoned.size == 0)


@pytest.mark.parametrize("dtype", [np.float16, DTYPES[2]], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("inv_scale", [1.0, 0.5, 3.0, 1 / 3, 2.0**-10, 65536.0])
def test_every_16_bit_pattern_rounds_like_numpy(kernel, dtype, inv_scale):
    """All 65536 encodings: subnormals, rounding ties, overflow to inf, nan payloads; the
    vector path with ILP, and a misaligned copy for the scalar path."""
    every_value = np.arange(2**16, dtype=np.uint16).view(dtype)
    for layout in ("aligned", "in_place_misaligned"):
        result = run_checked(kernel, host([every_value]), float(np.float32(inv_scale)),
                             LAYOUT_BY_NAME[layout], np.random.default_rng(0))
        assert_passes(result)


def test_flag_is_computed_on_the_inputs(kernel):
    rng = np.random.default_rng(0)
    overflows = np.array([60000.0, 1.0], np.float16)  # finite in, inf out
    result = run_checked(kernel, host([overflows]), 2.0, LAYOUT_BY_NAME["aligned"], rng)
    assert_passes(result)
    assert result.all_finite and result.outputs[0][0] == 0x7C00
    result = run_checked(kernel, host([np.array([np.inf, 1.0], np.float32)]), 0.0,
                         LAYOUT_BY_NAME["aligned"], rng)
    assert_passes(result)
    assert not result.all_finite


def test_the_numpy_oracle_is_the_cpu_tests_oracle():
    """Where no denormal arises (random data), the IEEE oracle the GPU is held to equals
    tests/support/fused_op_cases.expected (which flushes denormals, as TensorFlow's CPU
    kernels run)."""
    rng = np.random.default_rng(4)
    arrays = poison(rng, random_gradients(rng, random_sizes(rng, 200)))
    want, want_finite = expected(arrays, 2.0**-9)
    got, got_finite = ieee_expected(host(arrays), 2.0**-9)
    assert got_finite == want_finite
    for bits, reference in zip(got, host(want)):
        nan = is_nan(reference.kind, reference.bits)
        assert np.array_equal(is_nan(reference.kind, bits), nan)  # payloads: see DEVICE_NAN
        assert np.array_equal(bits[~nan], reference.bits[~nan])


# --- the emulation runs what a GPU would ---------------------------------------------------

def test_results_do_not_depend_on_thread_order(kernel):
    rng = np.random.default_rng(9)
    tensors = host(poison(rng, random_gradients(rng, random_sizes(rng, 30))))
    outputs = []
    for order, seed in (("in_order", 0), ("reversed", 0), ("shuffled", 1), ("shuffled", 2)):
        kernel.set_thread_order(order, seed)
        result = run_checked(kernel, tensors, 0.7, LAYOUT_BY_NAME["in_place_misaligned"],
                             np.random.default_rng(0), 1000, 5)
        assert_passes(result)
        outputs.append(result.outputs)
    for other in outputs[1:]:
        for a, b in zip(outputs[0], other):
            assert np.array_equal(a, b)


def test_every_planned_block_and_thread_runs(kernel):
    rng = np.random.default_rng(3)
    tensors = host(random_gradients(rng, random_sizes(rng, 300)))
    sizes, types = [t.size for t in tensors], [t.type_code for t in tensors]
    for chunk, max_tensors in PLAN_SHAPES[:2]:
        assert_passes(run_checked(kernel, tensors, 0.5, LAYOUT_BY_NAME["aligned"], rng, chunk,
                                  max_tensors))
        counts = kernel.take_counts()
        plan = kernel.plan(sizes, types, chunk, max_tensors)
        assert ((counts.launches, counts.blocks, counts.threads) ==
                (plan.launches, plan.blocks, 512 * plan.blocks))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_models_launches_and_blocks_counted_by_the_emulation(kernel, model):
    """The op's launch sequence on a model's gradient list, counted without running threads
    (never dereferenced addresses): few launches, under 10% of block capacity idle."""
    sizes = model_sizes(model)
    kernel.set_execute(False)
    scalars = kernel.malloc(8)
    try:
        fake = [(i + 1) << 32 for i in range(len(sizes))]
        kernel.unscale(TensorList(fake, fake, sizes, [0] * len(sizes)), scalars, scalars + 4)
    finally:
        kernel.free(scalars)
        kernel.set_execute(True)
    counts = kernel.take_counts()
    assert counts.launches == -(-len(sizes) // kernel.max_tensors)
    assert 1 - sum(sizes) / (counts.blocks * kernel.chunk_elements) < 0.1


# --- launch tables: 32 KB where the toolkit and the driver pass them, else 4 KB -----------

def long_list(seed):
    """1000 small tensors of mixed types, inf/nan in each: more than a 4 KB table holds."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 300, 1000) * (rng.random(1000) > 0.05)  # some empty
    return host(poison(rng, random_gradients(rng, sizes.tolist())))


def four_kb_launches(kernel, tensors):
    return -(-sum(1 for t in tensors if t.size) // kernel.table_slots.small)


@pytest.mark.parametrize("version", [13000, 12010, 12000, 11080])
def test_a_long_list_takes_as_few_launches_as_the_driver_allows(kernel, driver_version,
                                                                version):
    """Drivers from 12.1 take the 32 KB table: one launch. Older ones get 4 KB tables (the
    emulation, like such a driver, refuses a launch with more parameters)."""
    driver_version(version)
    tensors = long_list(version)
    for layout in ("aligned", "in_place_misaligned"):
        result = run_checked(kernel, tensors, 0.375, LAYOUT_BY_NAME[layout],
                             np.random.default_rng(0))
        assert_passes(result)
        assert not result.all_finite
        assert result.launches == (1 if version >= 12010 else four_kb_launches(kernel, tensors))
    slots = kernel.table_slots
    assert kernel.max_tensors == (slots.large if version >= 12010 else slots.small)


def test_a_stream_being_captured_into_a_graph_gets_4kb_launches(kernel):
    """CUDA graphs have crashed on kernel nodes over 4 KB (openxla/xla#19252): while the
    stream is being captured, the op keeps to the 4 KB table."""
    tensors = long_list(5)
    kernel.set_capturing(True)
    try:
        assert kernel.max_tensors == kernel.table_slots.small
        result = run_checked(kernel, tensors, 0.375, LAYOUT_BY_NAME["aligned"],
                             np.random.default_rng(0))
    finally:
        kernel.set_capturing(False)
    assert_passes(result)
    assert result.launches == four_kb_launches(kernel, tensors)
    assert kernel.max_tensors == kernel.table_slots.large


def test_a_refused_large_launch_is_planned_again_in_4kb_tables_for_good(emulated_kernel,
                                                                        tmp_path):
    """A driver that reports 12.1 but refuses the 32 KB launch: the call still unscales every
    tensor exactly once (in place too), in 4 KB launches, and so does every later call of the
    process without trying the large table again. A copy of the library is loaded: its
    process-wide fallback must not reach the other tests' harness."""
    copy = tmp_path / "fresh_harness.so"
    shutil.copyfile(emulated_kernel.path, copy)
    kernel = KernelHarness(copy)
    kernel.set_thread_order("shuffled", seed=4)
    assert kernel.max_tensors == kernel.table_slots.large
    kernel.set_refuse_large_launches(True)
    kernel.take_counts()
    expected_launches = 0
    try:
        for call, layout in enumerate(("in_place", "aligned")):
            tensors = long_list(20 + call)
            result = run_checked(kernel, tensors, 0.375, LAYOUT_BY_NAME[layout],
                                 np.random.default_rng(call))
            assert_passes(result)
            assert not result.all_finite
            assert result.launches == four_kb_launches(kernel, tensors)
            assert kernel.max_tensors == kernel.table_slots.small
            expected_launches += result.launches
        assert kernel.take_counts().launches == expected_launches  # the refused ones ran nothing
    finally:
        kernel.set_refuse_large_launches(False)
    assert kernel.max_tensors == kernel.table_slots.small  # remembered for the process
    assert emulated_kernel.max_tensors == emulated_kernel.table_slots.large


def test_the_large_table_is_used_only_past_the_small_ones_capacity(kernel):
    """A list a 4 KB table holds, or a plan of at most 203 tensors per launch, keeps the 4 KB
    table: its launches pass 16 KB less to the GPU."""
    sizes, types = [5] * 300, [0] * 300
    assert kernel.plan(sizes[:kernel.table_slots.small], types).table_bytes <= 4096
    assert kernel.plan(sizes, types, max_tensors=kernel.table_slots.small) == (2, 2, 4080)
    assert kernel.plan(sizes, types) == (1, 1, 32744)


def test_a_cuda_11_build_has_4kb_tables_only(emulated_kernel_cuda11):
    """An nvcc before 12.1 compiles no kernel with parameters over 4 KB (the emulation's
    static_assert holds it to that): even a new driver then gets 4 KB launches."""
    kernel = emulated_kernel_cuda11
    kernel.set_thread_order("shuffled", seed=3)
    assert kernel.max_tensors == kernel.table_slots.small
    tensors = long_list(11)
    result = run_checked(kernel, tensors, 0.375, LAYOUT_BY_NAME["misaligned"],
                         np.random.default_rng(0))
    assert_passes(result)
    assert result.launches == four_kb_launches(kernel, tensors)
    with pytest.raises(HarnessError, match=r"max_tensors must be in \[1, %d\]" % kernel.max_tensors):
        kernel.plan([1] * 300, [0] * 300, max_tensors=kernel.table_slots.small + 1)


# --- the checks fail when the kernel misbehaves --------------------------------------------

class MisbehavingCall:
    """The emulated kernel, called the wrong way: a size off by ``size_delta`` for tensor 0,
    or the whole call made twice."""

    def __init__(self, harness, size_delta=0, calls=1):
        self.harness, self.size_delta, self.calls = harness, size_delta, calls

    def __getattr__(self, name):
        return getattr(self.harness, name)

    def unscale(self, tensors, *args):
        tensors._sizes[0] += self.size_delta
        for _ in range(self.calls):
            launches = self.harness.unscale(tensors, *args)
        return launches


@pytest.mark.parametrize("size_delta, calls, layout, found", [
    (-1, 1, "aligned", "1 never written (still poisoned, first [99])"),
    (+1, 1, "misaligned", "after its data (first at byte"),
    (0, 2, "in_place", "scaled twice (written more than once"),
])
def test_unwritten_stray_and_repeated_writes_are_caught(kernel, size_delta, calls, layout, found):
    tensors = [HostTensor.from_values("float32", np.arange(1, 101)), HostTensor.from_values(
        "float16", np.ones(7))]
    result = run_checked(MisbehavingCall(kernel, size_delta, calls), tensors, 0.5,
                         LAYOUT_BY_NAME[layout], np.random.default_rng(0))
    assert any(found in problem for problem in result.problems), result.problems
