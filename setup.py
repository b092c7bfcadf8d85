"""Packaging for tfamp_rewrite.

TensorFlow is deliberately not a hard requirement: on the users' platform it comes
from the environment (NVIDIA's nvidia-tensorflow 1.15 in NGC containers), elsewhere
from PyPI through the ``cpu`` extra.
"""
from setuptools import find_packages, setup

setup(
    name="tfamp_rewrite",
    version="0.1.0",
    description="Automatic mixed precision for TensorFlow 1.x graphs: a Grappler-style "
    "rewrite, dynamic loss scaling and a fused unscale-and-check op.",
    packages=find_packages(include=["tfamp_rewrite", "tfamp_rewrite.*"])
    + ["tfamp_rewrite.custom_ops"],
    # The fused op's C++/CUDA sources ship as package data, so an installed tfamp_rewrite
    # can compile the op on first use (tfamp_rewrite/fused_op_build.py finds them there).
    package_dir={"tfamp_rewrite.custom_ops": "custom_ops"},
    package_data={"tfamp_rewrite.custom_ops": ["unscale_and_check_finite/*"]},
    python_requires=">=3.8",
    install_requires=["numpy", "protobuf"],
    extras_require={
        "cpu": ["tensorflow-cpu==2.15.1"],
        "nvidia": ["nvidia-pyindex", "nvidia-tensorflow[horovod]"],
        "test": [
            "pytest",
            "pytest-timeout",
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
            "tfamp-rewrite=tfamp_rewrite.cli:main",
            "tfamp-run=tfamp_rewrite.run:main",
        ],
    },
)
