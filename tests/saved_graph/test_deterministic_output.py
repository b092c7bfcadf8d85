"""Converting the same graph twice writes the same bytes, whatever order its maps came in.

Binary protobuf leaves the order of map entries (every NodeDef's ``attr``) to the runtime:
protobuf 3.20's C++ maps iterate in a per-process order, the pure-Python runtime in insertion
order.  The conversions here run in new processes on the pure-Python runtime with different
hash seeds, once from the saved file and once from a copy whose attr maps were re-encoded in
reverse order (the same message, other bytes): the outputs must be byte-identical.  (A
MetaGraph is written by the same code as a SavedModel's graph.)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import saved_graph_models as models
from cli_helpers import console_script
from repo_paths import SCRIPTS

REENCODE = os.path.join(SCRIPTS, "reencode_reversed.py")
FORMATS = ("frozen", "saved_model")


def _python_protobuf(seed: int) -> dict:
    return dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python", PYTHONHASHSEED=str(seed),
                TF_CPP_MIN_LOG_LEVEL="2")


def _convert(source: str, output: str, seed: int) -> None:
    completed = subprocess.run([console_script(), "convert", source, output, "--quiet"],
                               env=_python_protobuf(seed), capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]


def _contents(path: str) -> dict:
    """``{relative path: bytes}`` of a file or every file under a directory."""
    if not os.path.isdir(path):
        with open(path, "rb") as handle:
            return {"": handle.read()}
    found = {}
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                found[os.path.relpath(os.path.join(root, name), path)] = handle.read()
    return found


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """``{format: (saved path, re-encoded copy)}``, re-encoded in one pure-Python process."""
    directory = tmp_path_factory.mktemp("sources")
    saved = {"frozen": models.frozen_net(str(directory / "net.pb")),
             "saved_model": models.saved_model(str(directory))}
    pairs = {}
    for fmt, source in saved.items():
        copy = str(directory / ("reencoded_" + os.path.basename(source)))
        (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, copy)
        pairs[fmt] = (source, copy)
    completed = subprocess.run([sys.executable, REENCODE] + [copy for _, copy in pairs.values()],
                               env=_python_protobuf(0), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return pairs


@pytest.mark.parametrize("fmt", FORMATS)
def test_converting_twice_writes_the_same_bytes(fmt, sources, tmp_path):
    source, reencoded = sources[fmt]
    assert _contents(reencoded) != _contents(source)  # premise: other bytes, same message
    suffix = os.path.splitext(source)[1]
    outputs = [str(tmp_path / ("out%d%s" % (i, suffix))) for i in range(2)]
    _convert(source, outputs[0], seed=1)
    _convert(reencoded, outputs[1], seed=2)
    first = _contents(outputs[0])
    assert first and _contents(outputs[1]) == first
