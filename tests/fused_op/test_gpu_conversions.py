"""The kernel's element conversions: the device instructions' models and the CPU kernel's
portable code, held to one numpy model of the instructions (tests/gpu/conversion_check.py).

On a GPU, `make test-gpu` holds the real instructions to the same model; here the grid
emulation runs the device code with the instructions' models, compiled for the host, for an
sm_75 device (bfloat16 through the portable rounding) and an sm_90 one (cvt.rn.bf16.f32).
Together: the host build of every conversion equals the device instruction, bit for bit.
"""
from __future__ import annotations

import conversion_check
import harness_build
import numpy as np
import pytest
from device_check import LAYOUT_BY_NAME, run_checked
from fused_op_cases import DTYPES
from unscale_reference import DEVICE_NAN, HostTensor


@pytest.fixture(params=[75, 90], ids=["sm_75", "sm_90"])
def any_arch_kernel(request, emulated_kernel, emulated_kernel_sm90):
    return {75: emulated_kernel, 90: emulated_kernel_sm90}[request.param], request.param


def test_every_conversion_equals_the_instruction_model_bit_for_bit(any_arch_kernel):
    kernel, arch = any_arch_kernel
    results = conversion_check.check_conversions(kernel, arch // 10)
    assert [r.conversion.name for r in results] == [c.name for c in conversion_check.CONVERSIONS]
    for r in results:
        assert r.mismatches == 0, f"{r.conversion.name}: {r.first}"
    by_name = {r.conversion.name: r for r in results}
    # Instructions write the canonical NaN; the portable code keeps payloads.
    assert by_name["cvt.rn.f16.f32"].nan_outputs == [0x7FFF]
    assert by_name["cvt.f32.f16"].nan_outputs == [0x7FFFFFFF]
    assert len(by_name["portable float -> half"].nan_outputs) > 1


def test_the_boundary_sweep_holds_every_rounding_tie():
    """Every float16 tie (odd half + half an ulp) and every bfloat16 tie is an input, with its
    neighbours one float32 ulp away, in both signs; so are NaNs with low and high payloads."""
    bits = conversion_check.float32_boundaries()
    values = set(bits.tolist())
    rng = np.random.default_rng(0)
    for half in rng.integers(0x0400, 0x7BFF, 200, dtype=np.uint16):
        low = np.float32(np.uint16(half).view(np.float16))
        high = np.float32(np.uint16(half + 1).view(np.float16))
        tie = np.float32((np.float64(low) + np.float64(high)) / 2).view(np.uint32)
        assert {int(tie) - 1, int(tie), int(tie) + 1, int(tie) | 0x80000000} <= values
    for high16 in rng.integers(0, 0x7F80, 200):
        tie = (int(high16) << 16) | 0x8000
        assert {tie - 1, tie, tie + 1, tie | 0x80000000} <= values
    assert {0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x477FF000} <= values


@pytest.mark.parametrize("dtype", [np.float16, DTYPES[2], np.float32],
                         ids=["float16", "bfloat16", "float32"])
def test_device_nan_outputs_are_tensorflows_gpu_nans(any_arch_kernel, dtype):
    """Every NaN input, whatever its payload and sign, comes out as the one NaN TensorFlow's
    GPU composite writes (float32 0x7fffffff, float16 0x7fff, bfloat16 0x7fc0), through the
    vector path and the scalar path; every other element matches numpy bit for bit."""
    kernel, _ = any_arch_kernel
    kind = np.dtype(dtype).name
    if kind == "float32":
        nans = np.array([0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0x7FA00000], np.uint32)
    else:
        every = np.arange(2**16, dtype=np.uint16)
        exponent = 0x7C00 if kind == "float16" else 0x7F80
        nans = every[(every & 0x7FFF) > exponent]
    values = np.concatenate([nans, HostTensor.from_values(kind, [1.0, -2.5, 3e-3]).bits])
    for layout in ("aligned", "in_place_misaligned"):
        result = run_checked(kernel, [HostTensor(kind, values)], 0.25, LAYOUT_BY_NAME[layout],
                             np.random.default_rng(0))
        assert not result.problems, result.problems
        assert not result.all_finite
        assert set(result.outputs[0][:nans.size].tolist()) == {DEVICE_NAN[kind]}


def test_a_nan_scale_gives_tensorflows_nan_on_finite_bfloat16_inputs(any_arch_kernel):
    """A product can be NaN with no NaN input: a NaN scale. The vector path must still write
    TensorFlow's bfloat16 NaN (its rewrite is skipped only for finite inputs and scales)."""
    kernel, _ = any_arch_kernel
    tensor = HostTensor.from_values("bfloat16", np.linspace(-4, 4, 64))
    result = run_checked(kernel, [tensor], float("nan"), LAYOUT_BY_NAME["aligned"],
                         np.random.default_rng(0))
    assert not result.problems, result.problems
    assert result.all_finite  # the flag is about the inputs
    assert set(result.outputs[0].tolist()) == {DEVICE_NAN["bfloat16"]}


def test_occupancy_from_registers_and_the_architectures_limits():
    assert harness_build.occupancy(90, 64) == (2, 0.5)  # 64 x 512 x 2 = all 64K registers
    assert harness_build.occupancy(90, 65) == (1, 0.25)
    assert harness_build.occupancy(75, 60) == (2, 1.0)  # sm_75: 1024 threads per SM
    assert harness_build.occupancy(86, 64) == (2, 2 / 3)
    assert harness_build.occupancy(90, 32, threads=256) == (8, 1.0)
    assert harness_build.occupancy(42, 32) is None


def test_ptx_holds_the_conversion_instructions_per_architecture():
    """sm_75 has no bfloat16 conversion instruction: its build keeps the portable rounding;
    sm_80 and newer convert both 16-bit types with one instruction each."""
    toolchain = harness_build.find_toolchain()
    if toolchain is None:
        pytest.skip("no nvcc on this machine")
    counts = harness_build.conversion_instructions([75, 90], toolchain)
    assert counts[75]["cvt.rn.bf16.f32"] == 0
    assert counts[75]["cvt.rn.f16.f32"] > 0 and counts[75]["cvt.f32.f16"] > 0
    assert all(count > 0 for count in counts[90].values())
