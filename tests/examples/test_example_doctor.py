"""tfamp-rewrite doctor on the ResNet-50 and transformer examples, run small (example_runs.py's flags)."""
from __future__ import annotations

import json
import math
import os

import jsonschema
import pytest
from cli_helpers import run_cli
from example_runs import TINY_RESNET, TINY_TRANSFORMER
from repo_paths import EXAMPLES

from tfamp_rewrite.saved_graph import report_schema

BENCHMARK = ["--mode", "training_benchmark", "--num_iter", "20", "--warmup_steps", "1"]
pytestmark = pytest.mark.own_processes("tfamp-rewrite doctor runs the example in a process of its own")


@pytest.mark.parametrize("name, flags", [("resnet50", TINY_RESNET), ("transformer", TINY_TRANSFORMER)])
def test_the_doctor_probes_an_example_and_advises_a_loss_scale(tmp_path, name, flags):
    report_path = tmp_path / "doctor.json"
    completed = run_cli("doctor", "--steps", "2", "--plain-steps", "1", "--report", str(report_path),
                        os.path.join(EXAMPLES, name, "main.py"), *(BENCHMARK + flags))
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(report_path.read_text())
    jsonschema.Draft7Validator(report_schema.DOCTOR_SCHEMA).validate(report)
    assert report["steps"] == 2 and report["tensors_probed"] > 20
    gradients = report["gradients"]
    assert gradients["activation_tensors"] > 0 and gradients["weight_tensors"] > 0
    advice = report["loss_scale"]
    assert advice["current"] == 32768.0                         # tfamp-run's dynamic scale, read per step
    assert math.log2(advice["recommended"]).is_integer() and advice["at_recommended"]["overflow"] == 0
    assert advice["at_recommended"]["flush"] <= advice["unscaled"]["flush"]
    assert "Loss scale: " in completed.stdout and "dynamic loss scaling needed" in completed.stdout
