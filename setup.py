"""Packaging for tfamp_rewrite.

TensorFlow is deliberately not a hard requirement: on the users' platform it comes
from the environment (NVIDIA's nvidia-tensorflow 1.15 in NGC containers), elsewhere
from PyPI through the ``cpu`` extra.

``tfamp_rewrite_startup.pth`` is installed next to the packages: Python runs it at start-up,
and it makes ``TF_ENABLE_AUTO_MIXED_PRECISION=1 python train.py`` work with no code change
(see tfamp_rewrite_startup.py; it does nothing when the variable is not set).
"""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

STARTUP_PTH = "tfamp_rewrite_startup.pth"


class BuildPyWithStartupHook(build_py):
    """Puts the start-up ``.pth`` file at the top of the wheel, i.e. in site-packages."""

    def run(self):
        super().run()
        self.copy_file(STARTUP_PTH, os.path.join(self.build_lib, STARTUP_PTH))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, STARTUP_PTH)]

setup(
    name="tfamp_rewrite",
    version="0.1.0",
    description="Automatic mixed precision for TensorFlow 1.x graphs: a Grappler-style "
    "rewrite, dynamic loss scaling and a fused unscale-and-check op.",
    packages=find_packages(include=["tfamp_rewrite", "tfamp_rewrite.*"])
    + ["tfamp_rewrite.custom_ops"],
    # The ops' C++/CUDA sources ship as package data, so an installed tfamp_rewrite
    # can compile the op on first use (tfamp_rewrite/fused_op/build.py finds them there).
    package_dir={"tfamp_rewrite.custom_ops": "custom_ops"},
    package_data={"tfamp_rewrite.custom_ops": ["unscale_and_check_finite/*", "round_to_half/*"]},
    py_modules=["tfamp_rewrite_startup"],
    cmdclass={"build_py": BuildPyWithStartupHook},
    python_requires=">=3.7",
    install_requires=["numpy", "protobuf"],
    extras_require={
        "cpu": ["tensorflow-cpu==2.15.1"],
        "nvidia": ["nvidia-pyindex", "nvidia-tensorflow[horovod]"],
        "test": [
            "pytest",
            "pytest-timeout",
            "pytest-xdist",
            "hypothesis",
            "jsonschema",
            "ruff",
            "vermin",
            "matplotlib",
            "scikit-learn",
        ],
    },
    entry_points={
        "console_scripts": [
            "tfamp-rewrite=tfamp_rewrite.saved_graph.cli:main",
            "tfamp-run=tfamp_rewrite.training.run:main",
        ],
    },
)
