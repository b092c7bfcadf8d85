"""Two real Horovod ranks (Gloo, 127.0.0.1) training with loss scaling in every supported setup.

Setups (horovod_worker.SCENARIOS): ``hvd.DistributedOptimizer`` outside and inside the
loss-scale optimizer, each also with ``hvd.Compression.fp16``, and env activation
(``TF_ENABLE_AUTO_MIXED_PRECISION=1`` with a plain ``hvd.DistributedOptimizer(opt)``).
The ranks start from different weights and loss scales and compute different
gradients; rank 1 alone overflows at step 2.  Both ranks must end every step with
identical variables, skip step 2 together and lower the scale together -- and finish.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from loss_scaling_problems import GOOD_STEPS, SCALE, without_loss_scale

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_worker.py")
WRAP_ORDERS = ["hvd_outer", "hvd_inner", "hvd_outer_fp16", "hvd_inner_fp16"]
INITIAL_W = [0.5, -0.25, 1.0]  # loss_scaling_problems.build's; rank 1 starts from w + 1


def launch(run_ranks, scenarios, env):
    """Runs the worker on two ranks; returns each rank's ``{scenario: report}``."""
    results = run_ranks([WORKER, *scenarios], ranks=2, timeout=240,
                        env={"TFAMP_REWRITE_TARGET": "cpu", **env})
    return [json.loads(result.stdout.strip().splitlines()[-1]) for result in results]


@pytest.fixture(scope="module")
def reports(horovod_ranks):
    """Both ranks' reports of every scenario: one launch for the wrap orders, one for env."""
    explicit = launch(horovod_ranks, WRAP_ORDERS, {"TF_ENABLE_AUTO_MIXED_PRECISION": None})
    automatic = launch(horovod_ranks, ["env"], {"TF_ENABLE_AUTO_MIXED_PRECISION": "1"})
    return [{**e, **a} for e, a in zip(explicit, automatic)]


@pytest.mark.parametrize("scenario", WRAP_ORDERS + ["env"])
def test_an_overflow_on_one_rank_skips_the_step_on_both_and_ranks_stay_identical(reports, scenario):
    rank0, rank1 = (report[scenario]["states"] for report in reports)
    assert rank0 == rank1
    start, first, skipped, last = ({k: np.array(v) for k, v in state.items()} for state in rank0)
    if scenario != "env":  # rank 0's weights and loss scale (2**10; rank 1's was 2**11) won
        np.testing.assert_array_equal(start["w"], INITIAL_W)
        assert start[SCALE] == 2.0**10
    assert first["global_step"] == 1 and not np.array_equal(first["w"], start["w"])
    for name, value in without_loss_scale(first).items():
        np.testing.assert_array_equal(skipped[name], value, err_msg=name)
    assert skipped[SCALE] == first[SCALE] / 2 and skipped[GOOD_STEPS] == 0
    assert last["global_step"] == 2 and not np.array_equal(last["w"], skipped["w"])


@pytest.mark.parametrize("scenario", WRAP_ORDERS + ["env"])
def test_gradients_are_allreduced_outside_the_skip_branch(reports, scenario):
    report = reports[0][scenario]
    assert report["allreduce_dtypes"] == (["float16"] if scenario.endswith("_fp16") else ["float32"])
    assert report["data_dependent_conds"] >= 1  # the skip-this-step cond
    assert report["collectives_in_them"] == []
