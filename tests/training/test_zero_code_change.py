"""An unmodified TF1 script trains in mixed precision with the environment variable alone.

Each case runs ``tests/support/scripts/unmodified_tf1_script.py`` in a fresh interpreter (the
start-up hook only acts at interpreter start) and reads the JSON it prints.
"""
import json
import os
import subprocess
import sys
import sysconfig

import pytest
from repo_paths import REPO, SCRIPTS

SCRIPT = os.path.join(SCRIPTS, "unmodified_tf1_script.py")
BIN = os.path.dirname(sys.executable)
# Every test runs an unmodified TF1 script in a new process, as users do.
pytestmark = pytest.mark.own_processes("an unmodified TF1 script in a new process")
AMP_ENV = {"TF_ENABLE_AUTO_MIXED_PRECISION": "1", "TFAMP_REWRITE_TARGET": "cpu"}


def run_script(command, extra_env=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_ENABLE_AUTO_MIXED", "TFAMP_"))}
    env.update(extra_env or {})
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run(command, env=env, cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def assert_trained_in_amp(result):
    assert result["probe_is_inf"], "the MatMul did not run in float16"
    assert result["loss_scale_variables"] == ["loss_scale/current_loss_scale", "loss_scale/good_steps"]
    assert result["session_class"] == "tfamp_rewrite.training.session.Session"
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.parametrize("launcher", ["python", "tfamp-run", "python -m tfamp_rewrite.run"])
def test_unmodified_script_trains_in_amp(launcher):
    command = {
        "python": [sys.executable, SCRIPT, "--flag"],
        "tfamp-run": [os.path.join(BIN, "tfamp-run"), SCRIPT, "--flag"],
        "python -m tfamp_rewrite.run": [sys.executable, "-m", "tfamp_rewrite.run", SCRIPT, "--flag"],
    }[launcher]
    env = dict(AMP_ENV) if launcher == "python" else {"TFAMP_REWRITE_TARGET": "cpu"}
    result = run_script(command, env, cwd=SCRIPTS)
    assert_trained_in_amp(result)
    assert result["argv"] == ["--flag"]  # the script sees its own arguments


def test_without_the_variable_it_trains_in_float32():
    result = run_script([sys.executable, SCRIPT], {"TFAMP_REWRITE_TARGET": "cpu"})
    assert not result["probe_is_inf"] and result["loss_scale_variables"] == []
    assert result["session_class"] == "tensorflow.python.client.session.Session"


def test_tfamp_run_without_loss_scaling_only_rewrites():
    result = run_script([os.path.join(BIN, "tfamp-run"), "--no-loss-scaling", "--target", "cpu", SCRIPT])
    assert result["probe_is_inf"] and result["loss_scale_variables"] == []


def test_tfamp_run_names_a_missing_script():
    done = subprocess.run([os.path.join(BIN, "tfamp-run"), "no_such_script.py"], stderr=subprocess.PIPE,
                          text=True, timeout=120)
    assert done.returncode == 2 and "no_such_script.py: no such file" in done.stderr


def test_a_regular_install_ships_the_start_up_hook(tmp_path):
    """pip install (not editable) into a fresh virtualenv: the .pth hook works from there."""
    venv = tmp_path / "venv"
    # Without pip of its own (seeding one costs more than the rest): this environment's pip
    # builds the wheel and installs it there (pip >= 22.3's --python).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    # TensorFlow and friends come from the test environment, as a plain path (its .pth
    # files, among them the editable install of this repository, are not processed).
    with open(os.path.join(site, "test_environment.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels),
                          REPO], check=True, timeout=600)
    subprocess.run(pip + ["--python", python, "install", "-q", "--no-deps", "--no-index"]
                   + [str(path) for path in wheels.glob("*.whl")], check=True, timeout=600)
    assert os.path.isfile(os.path.join(site, "tfamp_rewrite_startup.pth"))
    result = run_script([python, SCRIPT], AMP_ENV, cwd=str(tmp_path))
    assert_trained_in_amp(result)
