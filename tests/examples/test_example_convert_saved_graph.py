"""The convert_saved_graph example runs end to end and reports agreement for every model."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import EXAMPLES

EXAMPLE = os.path.join(EXAMPLES, "convert_saved_graph", "run.py")


@pytest.mark.own_processes("the example is a script of its own, run in a new process")
def test_example_converts_validates_and_times(tmp_path):
    command = [sys.executable, EXAMPLE, "--out", str(tmp_path / "out"), "--runs", "1", "--batch", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("SavedModel ->", "frozen .pb ->"))]
    assert len(rows) == 3
    assert all(row[-2] == "100.0%" for row in rows)  # top-1 agreement
    assert "probs: float32" in result.stdout and "a graph output (keep-io-types)" in result.stdout
    for name in ("saved_model_fp16", "frozen_fp16.pb", "frozen_bf16.pb", "frozen_fp16.json"):
        assert os.path.exists(tmp_path / "out" / name)
