"""A forward overflow on one Horovod rank is named, not healed: a heal re-imports that rank's
graph under new names, and Horovod matches collectives across ranks by name, so a rank that
healed alone would wait for its peer for ever."""
from __future__ import annotations

import json
import os

import pytest
from repo_paths import SCRIPTS

STEPS = 14  # enough for rank 0's diagnosis (after its scale fell by 2**8), short of the floor


@pytest.mark.own_processes("two Horovod ranks")
def test_a_culprit_on_one_rank_is_named_and_every_rank_finishes(horovod_ranks):
    results = horovod_ranks([os.path.join(SCRIPTS, "horovod_forward_overflow.py"), str(STEPS)], ranks=2,
                            timeout=240, env={"TF_ENABLE_AUTO_MIXED_PRECISION": "1",
                                              "TFAMP_REWRITE_TARGET": "cpu"})
    reports = [json.loads(result.stdout.strip().splitlines()[-1]) for result in results]
    assert [report["runs"] for report in reports] == [STEPS, STEPS]
    assert reports[0]["global_step"] == reports[1]["global_step"]
    rank0 = results[0].stderr
    assert "training steps are being skipped" in rank0 and "healing is off in a Horovod job" in rank0
    assert "healed:" not in rank0 and "healed:" not in results[1].stderr
