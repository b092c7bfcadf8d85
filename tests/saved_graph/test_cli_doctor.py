"""tfamp-rewrite doctor: runs a training program under the precision doctor in a child process."""
from __future__ import annotations

import json
import os

import jsonschema
import pytest
from cli_helpers import run_cli, run_main
from repo_paths import EXAMPLES

from tfamp_rewrite.saved_graph import report_schema

SCRIPT = os.path.join(EXAMPLES, "doctor", "misbehaving.py")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def doctored(tmp_path_factory):
    directory = tmp_path_factory.mktemp("doctor")
    report, plot = directory / "doctor.json", directory / "gradients.png"
    completed = run_cli("doctor", "--steps", "3", "--plain-steps", "1", "--report", str(report),
                        "--plot", str(plot), SCRIPT, "--problem", "overflow", "--steps", "100")
    return completed, report, plot


@pytest.mark.own_processes("tfamp-rewrite doctor runs a TF1 script in a process of its own")
def test_the_doctor_names_the_overflow_and_writes_report_and_plot(doctored):
    completed, report, plot = doctored
    assert completed.returncode == 0, completed.stderr[-3000:]
    written = json.loads(report.read_text())
    jsonschema.Draft7Validator(report_schema.DOCTOR_SCHEMA).validate(written)
    assert written["steps"] == 3 and written["timing"]["plain_steps"] == 1
    assert [r["node"] for r in written["overflow"]] == ["sum_of_squares/square"]
    # tfamp-run's activation: the optimizer scaled its loss dynamically, from 2**15
    assert written["scales"] == [32768.0] * 3 and written["loss_scale"]["current"] == 32768.0
    assert plot.read_bytes().startswith(PNG)
    assert "sum_of_squares/square:0  Mul (infer list, forward)" in completed.stdout
    assert "INFERLIST_REMOVE=Mul" in completed.stdout and "wrote %s" % plot in completed.stdout
    # the program ran no further than asked: 3 probed steps and 1 timed one
    assert "step  100" not in completed.stdout


@pytest.mark.parametrize("args, message", [
    (["no_such_script.py"], "no_such_script.py: no such file"),
    (["--steps", "0", SCRIPT], "--steps must be 1 or more"),
    (["--plot", "picture.jpg", SCRIPT], "does not end in .png"),
    ([], "doctor needs a program to run"),
])
def test_bad_arguments_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    report = tmp_path / "r.json"
    code, _, err = run_main(capsys, "doctor", "--report", str(report), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not report.exists()


@pytest.mark.own_processes("tfamp-rewrite doctor runs the script in a process of its own")
def test_a_failing_program_is_one_line_and_writes_nothing(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise ValueError('no data here')\n")
    report = tmp_path / "r.json"
    completed = run_cli("doctor", "--report", str(report), str(script))
    assert completed.returncode == 2 and not report.exists()
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("tfamp-rewrite: ") and "ValueError: no data here" in last
