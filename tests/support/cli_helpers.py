"""Running ``tfamp-rewrite`` in tests: as a subprocess (the console script, or ``python -m``)
and in-process through ``cli.main``; plus small checks on converted graphs."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import List, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tfamp_rewrite.saved_graph.cli import main

HALF = tf.float16.as_datatype_enum
FLOAT = tf.float32.as_datatype_enum


def console_script() -> str:
    """The installed ``tfamp-rewrite`` beside this Python (fails if the entry point is missing)."""
    path = os.path.join(os.path.dirname(sys.executable), "tfamp-rewrite")
    assert os.path.exists(path), "the tfamp-rewrite console script is not installed (pip install -e .)"
    return path


# The command-line tests' expectations (nodes converted, reason chains) are the newest pass's,
# the same whichever TensorFlow runs them: ``convert`` and ``explain`` run with --compat latest
# unless the arguments name a compat.  The default, the installed TensorFlow's pass, has its own
# tests (test_cli_compat.py).
_PINNED_COMPAT = ("--compat", "latest")


def _pinned(args) -> list:
    args = list(args)
    if args[:1] in (["convert"], ["explain"]) and "--compat" not in args:
        args[1:1] = list(_PINNED_COMPAT)
    return args


def run_cli(*args: str, module: bool = False) -> subprocess.CompletedProcess:
    """Runs the command line in a new process; TensorFlow's C++ INFO logs are silenced."""
    command = [sys.executable, "-m", "tfamp_rewrite"] if module else [console_script()]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(command + _pinned(args), capture_output=True, text=True, env=env, timeout=600)


def run_main(capsys, *args: str) -> Tuple[int, str, str]:
    """Runs ``cli.main`` in this process; returns (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(_pinned(args))
    out, err = capsys.readouterr()
    return code, out, err


def read_graph(path: str):
    graph_def = graph_pb2.GraphDef()
    with open(path, "rb") as handle:
        graph_def.ParseFromString(handle.read())
    return graph_def


def node_types(graph_def) -> dict:
    """``{node name: (op, T/dtype/DstT attr)}``."""
    result = {}
    for node in graph_def.node:
        dtype = next((node.attr[key].type for key in ("T", "dtype", "DstT") if key in node.attr), None)
        result[node.name] = (node.op, dtype)
    return result


def run_graph(graph_def, fetches: List[str], feeds: dict):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(fetches, feeds)


def digest(path: str) -> str:
    """A hash of a file or of a directory's files (names and contents)."""
    sha = hashlib.sha256()
    paths = [path] if os.path.isfile(path) else sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
    for item in paths:
        sha.update(item.encode())
        with open(item, "rb") as handle:
            sha.update(handle.read())
    return sha.hexdigest()


def random_images(batch: int = 3, size: int = 8) -> np.ndarray:
    return np.random.default_rng(5).standard_normal([batch, size, size, 3]).astype(np.float32)
