"""Fixtures of the compiled ops' tests.

The GPU harness's TensorFlow-free modules (tests/gpu: the CPU grid emulation's build, the
numpy oracle, model gradient sets) are imported by bare name here.
"""
import os
import sys

import pytest
from cpu_features import ISAS, describe_cpu

import tfamp_rewrite
from tfamp_rewrite.fused_op import op as fused_op

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "gpu"))


@pytest.fixture(params=ISAS)
def cpu_isa(request, monkeypatch):
    """Caps the CPU kernels at one path (skipping paths this CPU lacks) for sessions made
    now; a cap already in the environment (``make test-avx2``) counts as the CPU's limit."""
    assert tfamp_rewrite.fused_op_available(), "the fused op must build and load (make op)"
    best = fused_op.cpu_kernel_isa()
    if ISAS.index(request.param) > ISAS.index(best):
        pytest.skip("this CPU has no %s path (its best is %s; %s)" % (request.param, best, describe_cpu()))
    monkeypatch.setenv(fused_op.CPU_ISA_ENV, request.param)
    assert fused_op.cpu_kernel_isa() == request.param
    return request.param


@pytest.fixture(scope="session")
def emulated_kernel(tmp_path_factory):
    """The kernel harness built against the CPU grid emulation (gpu_launch.cu as C++) of an
    sm_75 device: no bfloat16 conversion instruction, the portable rounding."""
    from harness_build import build_emulation
    from harness_library import KernelHarness

    return KernelHarness(build_emulation(tmp_path_factory.mktemp("grid-emulation")))


@pytest.fixture(scope="session")
def emulated_kernel_sm90(tmp_path_factory):
    """The same for an sm_90 device: bfloat16 through cvt.rn.bf16.f32's model."""
    from harness_build import build_emulation
    from harness_library import KernelHarness

    return KernelHarness(build_emulation(tmp_path_factory.mktemp("grid-emulation-sm90"),
                                         arch=90))


@pytest.fixture(scope="session")
def emulated_kernel_cuda11(tmp_path_factory):
    """The sm_75 emulation compiled as by CUDA 11.8's nvcc: kernel parameters of 4 KB at most,
    so the 32 KB launch table is not compiled in."""
    from harness_build import build_emulation
    from harness_library import KernelHarness

    return KernelHarness(build_emulation(tmp_path_factory.mktemp("grid-emulation-cuda11"),
                                         cuda_version=11080))


@pytest.fixture
def driver_version(emulated_kernel):
    """Sets what the emulated driver reports (e.g. 12000: CUDA 12.0); the emulation's default
    comes back afterwards."""
    from harness_library import EMULATED_DRIVER_VERSION

    yield emulated_kernel.set_driver_version
    emulated_kernel.set_driver_version(EMULATED_DRIVER_VERSION)
