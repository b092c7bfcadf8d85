"""Two real Horovod ranks (Gloo, 127.0.0.1) training with loss scaling in every supported setup.

Setups (horovod_worker.SCENARIOS): ``hvd.DistributedOptimizer`` outside and inside the
loss-scale optimizer, each also with ``hvd.Compression.fp16``, with gradient accumulation
(``backward_passes_per_step=2``: works outside, refused inside), and env activation
(``TF_ENABLE_AUTO_MIXED_PRECISION=1`` with a plain ``hvd.DistributedOptimizer(opt)``).
The ranks start from different weights and loss scales and compute different
gradients; rank 1 alone overflows once.  Both ranks must end every step with identical
variables, skip the same step and lower the scale together -- and finish.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from loss_scaling_problems import GOOD_STEPS, SCALE, without_loss_scale
from repo_paths import SUPPORT

WORKER = os.path.join(SUPPORT, "horovod_worker.py")
WRAP_ORDERS = ["hvd_outer", "hvd_inner", "hvd_outer_fp16", "hvd_inner_fp16"]
ACCUMULATING = ["hvd_outer_accumulate", "hvd_inner_accumulate"]
INITIAL_W = [0.5, -0.25, 1.0]  # loss_scaling_problems.build's; rank 1 starts from w + 1


def launch(run_ranks, scenarios, env):
    """Runs the worker on two ranks; returns each rank's ``{scenario: report}``."""
    results = run_ranks([WORKER, *scenarios], ranks=2, timeout=240,
                        env={"TFAMP_REWRITE_TARGET": "cpu", **env})
    return [json.loads(result.stdout.strip().splitlines()[-1]) for result in results]


@pytest.fixture(scope="module")
def reports(horovod_ranks):
    """Both ranks' reports of every scenario: one launch for the wrap orders, one for env."""
    explicit = launch(horovod_ranks, WRAP_ORDERS + ACCUMULATING, {"TF_ENABLE_AUTO_MIXED_PRECISION": None})
    automatic = launch(horovod_ranks, ["env"], {"TF_ENABLE_AUTO_MIXED_PRECISION": "1"})
    return [{**e, **a} for e, a in zip(explicit, automatic)]


def identical_states(reports, scenario):
    """The variables after the broadcast and after each step, the same on both ranks."""
    rank0, rank1 = (report[scenario]["states"] for report in reports)
    assert rank0 == rank1
    return [{name: np.array(value) for name, value in state.items()} for state in rank0]


@pytest.mark.parametrize("scenario", WRAP_ORDERS + ["env"])
def test_an_overflow_on_one_rank_skips_the_step_on_both_and_ranks_stay_identical(reports, scenario):
    start, first, skipped, _, last = identical_states(reports, scenario)
    if scenario != "env":  # rank 0's weights and loss scale (2**10; rank 1's was 2**11) won
        np.testing.assert_array_equal(start["w"], INITIAL_W)
        assert start[SCALE] == 2.0**10
    assert first["global_step"] == 1 and not np.array_equal(first["w"], start["w"])
    for name, value in without_loss_scale(first).items():
        np.testing.assert_array_equal(skipped[name], value, err_msg=name)
    assert skipped[SCALE] == first[SCALE] / 2 and skipped[GOOD_STEPS] == 0
    assert last["global_step"] == 3 and not np.array_equal(last["w"], skipped["w"])


def test_accumulating_outside_skips_the_overflowing_allreduce_on_both_ranks(reports):
    start, *steps = identical_states(reports, "hvd_outer_accumulate")
    # Applied every second step: 2 (rank 1's sum holds its inf: skipped) and 4.
    assert [int(step["global_step"]) for step in steps] == [1, 1, 2, 3]
    for step in steps[:3]:
        np.testing.assert_array_equal(step["w"], start["w"])
    assert [step[SCALE] for step in steps] == [2.0**10, 2.0**9, 2.0**9, 2.0**9]
    assert not np.array_equal(steps[3]["w"], start["w"])


def test_accumulating_inside_is_refused_with_the_order_that_works(reports):
    refusal = reports[0]["hvd_inner_accumulate"]["refused"]
    assert "backward_passes_per_step > 1" in refusal
    assert "around the LossScaleOptimizer instead" in refusal


@pytest.mark.parametrize("scenario", WRAP_ORDERS + ["env"])
def test_gradients_are_allreduced_outside_the_skip_branch(reports, scenario):
    report = reports[0][scenario]
    assert report["allreduce_dtypes"] == (["float16"] if scenario.endswith("_fp16") else ["float32"])
    assert report["data_dependent_conds"] >= 1  # the skip-this-step cond
    assert report["collectives_in_them"] == []
