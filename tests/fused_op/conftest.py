"""Fixtures of the fused op's tests.

The GPU harness's TensorFlow-free modules (tests/gpu: the CPU grid emulation's build, the
numpy oracle, model gradient sets) are imported by bare name here.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "gpu"))


@pytest.fixture(scope="session")
def emulated_kernel(tmp_path_factory):
    """The kernel harness built against the CPU grid emulation (gpu_launch.cu as C++)."""
    from harness_build import build_emulation
    from harness_library import KernelHarness

    return KernelHarness(build_emulation(tmp_path_factory.mktemp("grid-emulation")))
