"""Activation works whatever the import order and however it is reached.

Every case is a fresh interpreter running ``tests/support/scripts/activation_probe.py`` (the
start-up hook acts only at interpreter start).  The factors: NVIDIA's variables {unset, ``=1``,
``_GRAPH_REWRITE=1`` only, ``_LOSS_SCALING=0`` only}, launchers {``python``, ``tfamp-run``,
``python -m tfamp_rewrite.run``} and import orders {TensorFlow first, tfamp_rewrite first,
tfamp_rewrite never imported by the script}, plus a child process started by the script.
Each case asserts what README's "Training in mixed precision" documents: half really ran (an
overflow probe) or did not, and loss scaling is on (variables, and an inf step skipped) or
off.  The cases run two at a time, in one fixture.

Each case costs a TensorFlow import (seconds), so ``make test`` runs a covering array
rather than all 36 combinations: every variable with every launcher (what decides the
outcome), and each import order with every variable and with every launcher; the child
cases are ``tfamp-run``'s with every variable (its promise covers the processes it starts)
and the start-up hook's in a child of plain ``python``.  ``TFAMP_TEST_ACTIVATION_MATRIX=full``
runs every combination (44 processes).
"""
import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
from repo_paths import SCRIPTS

PROBE = os.path.join(SCRIPTS, "activation_probe.py")
BIN = os.path.dirname(sys.executable)
MAIN, REWRITE, SCALING = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
                          "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING")
ENVIRONMENTS = {
    "unset": {},
    "enable=1": {MAIN: "1"},
    "graph_rewrite=1": {REWRITE: "1"},
    "loss_scaling=0": {SCALING: "0"},
}
LAUNCHERS = {
    "python": [sys.executable],
    "tfamp-run": [os.path.join(BIN, "tfamp-run")],
    "python -m tfamp_rewrite.run": [sys.executable, "-m", "tfamp_rewrite.run"],
}
ORDERS = ("tensorflow_first", "tfamp_rewrite_first", "tensorflow_only")
# (graph rewrite, loss scaling) per environment, under plain python and under the launcher
# (which sets TF_ENABLE_AUTO_MIXED_PRECISION=1 unless it is set; set variables decide).
EXPECTED = {
    ("unset", "python"): (False, False), ("unset", "launcher"): (True, True),
    ("enable=1", "python"): (True, True), ("enable=1", "launcher"): (True, True),
    ("graph_rewrite=1", "python"): (True, False), ("graph_rewrite=1", "launcher"): (True, True),
    ("loss_scaling=0", "python"): (False, False), ("loss_scaling=0", "launcher"): (True, False),
}


def _cases(full: bool) -> list:
    if full:
        cases = [(env, launcher, order) for env in ENVIRONMENTS for launcher in LAUNCHERS for order in ORDERS]
        return cases + [(env, launcher, "child") for env in ENVIRONMENTS
                        for launcher in ("python", "tfamp-run")]
    # Strength-2 covering array: order i + j + 2 (mod 3) for variable i and launcher j meets every
    # (variable, order) and every (launcher, order) pair; the + 2 gives unset/python the
    # tensorflow_only order, where test_activation checks that the hook costs nothing.
    cases = [(env, launcher, ORDERS[(i + j + 2) % len(ORDERS)])
             for i, env in enumerate(ENVIRONMENTS) for j, launcher in enumerate(LAUNCHERS)]
    return cases + [(env, "tfamp-run", "child") for env in ENVIRONMENTS] + [("enable=1", "python", "child")]


CASES = _cases(os.environ.get("TFAMP_TEST_ACTIVATION_MATRIX") == "full")


def _run(case):
    env_name, launcher, order = case
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_ENABLE_AUTO_MIXED", "TFAMP_"))}
    env.update(ENVIRONMENTS[env_name], TFAMP_REWRITE_TARGET="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(LAUNCHERS[launcher] + [PROBE, order], env=env, cwd=SCRIPTS,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[0][len("RESULT "):]) if lines else None
    return done.returncode, result, done.stderr


@pytest.fixture(scope="module")
def results():
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(CASES, pool.map(_run, CASES)))


@pytest.mark.own_processes("every case is a new Python process running a TF1 script")
@pytest.mark.parametrize("case", CASES, ids=["-".join(case) for case in CASES])
def test_activation(results, case):
    env_name, launcher, order = case
    code, result, stderr = results[case]
    assert code == 0 and result is not None, stderr[-3000:]
    assert "Traceback" not in stderr and "not activated" not in stderr, stderr[-3000:]
    rewrite, scaling = EXPECTED[env_name, "python" if launcher == "python" else "launcher"]
    assert result["probe_is_inf"] is rewrite, "float16 ran" if result["probe_is_inf"] else "float32 ran"
    assert result["session_class"] == ("tfamp_rewrite.training.session.Session" if rewrite
                                       else "tensorflow.python.client.session.Session")
    if scaling:
        assert result["loss_scale_variables"] == ["loss_scale/current_loss_scale", "loss_scale/good_steps"]
        assert result["skipped_inf_step"], "the inf gradient step was applied"
    else:
        assert result["loss_scale_variables"] == []
        assert not result["weight_after_inf_step_finite"], "the inf gradient step was not applied"
    if (env_name, launcher, order) == ("unset", "python", "tensorflow_only"):
        assert not result["tfamp_rewrite_imported"], "without the variables the hook must cost nothing"


def _plain_env(**variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_ENABLE_AUTO_MIXED", "TFAMP_"))}
    env.update(variables, TF_CPP_MIN_LOG_LEVEL="2")
    return env


def test_the_activation_module_imports_no_tensorflow():
    """What lets the hook run while any other module of the package is half-imported."""
    code = ("import sys, tfamp_rewrite.training.activation\n"
            "print(sorted(m for m in sys.modules if 'tensorflow' in m))")
    done = subprocess.run([sys.executable, "-c", code], env=_plain_env(), capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_a_malformed_variable_is_one_line_and_tensorflow_still_imports():
    env = _plain_env(TF_ENABLE_AUTO_MIXED_PRECISION="yes please")
    done = subprocess.run([sys.executable, "-c", "import tensorflow; print('imported')"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "imported" in done.stdout
    assert [line for line in done.stderr.splitlines() if "tfamp_rewrite" in line] == [
        "tfamp_rewrite: mixed precision is not activated: TF_ENABLE_AUTO_MIXED_PRECISION='yes please' "
        "is not a boolean; use 1/true or 0/false"]
    done = subprocess.run(LAUNCHERS["tfamp-run"] + [PROBE, "tensorflow_only"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "tfamp-run: TF_ENABLE_AUTO_MIXED_PRECISION='yes please' is not a boolean; use 1/true or 0/false"]
