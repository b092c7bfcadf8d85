"""``make demo``'s script: fp32 and AMP side by side, the rewrite summary, the loss-curve plot.

It runs in its own process: the training script it drives switches this process to
graph mode for good (``tf.compat.v1.disable_eager_execution``).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from example_runs import EXAMPLES


@pytest.mark.own_processes("the demo is a script of its own, run in a new process")
def test_demo_prints_both_runs_and_writes_the_plot(tmp_path):
    command = [sys.executable, os.path.join(EXAMPLES, "demo.py"), "--steps", "12", "--out", str(tmp_path)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TFAMP_REWRITE_TARGET", None)  # the demo picks the CPU itself when there is no GPU,
    env.pop("TFAMP_REWRITE_NUMERICS", None)  # and emulates a Tensor Core GPU's numerics there
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    assert "tfamp_rewrite pass summary (float16, target=cpu" in out
    assert "numerics emulate (float32 kernels on values rounded to float16" in out
    assert "numerics: emulated --" in out
    table = out[out.index("fp32 loss"):].splitlines()
    first_step = table[1].split()  # step, fp32 loss, AMP loss, loss scale
    assert first_step[0] == "1" and abs(float(first_step[1]) - float(first_step[2])) < 0.01
    assert float(first_step[3]) >= 1
    assert "test acc" in out and "plot: " in out
    with open(tmp_path / "loss_curves.png", "rb") as handle:
        png = handle.read()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10000
    assert os.path.getsize(tmp_path / "history.json") > 0
