"""examples/train_tf1 as a 2-rank Horovod job with mixed precision, as horovodrun would run it."""
from __future__ import annotations

import json
import os

from repo_paths import EXAMPLES

TRAIN = os.path.join(EXAMPLES, "train_tf1", "train.py")
STEPS = 60


def test_example_trains_on_two_ranks_with_loss_scaling(horovod_ranks, tmp_path):
    results = horovod_ranks(
        [TRAIN, "--horovod", "--amp", "--steps", str(STEPS), "--log-every", "20",
         "--json", str(tmp_path / "result.json")],
        ranks=2, timeout=300, env={"TFAMP_REWRITE_TARGET": "cpu"})
    rank0, rank1 = (result.stdout for result in results)
    # 1437 training images, sharded; the learning rate scaled by the number of ranks.
    assert "horovod: 2 ranks, 719 training images each, learning rate 0.1" in rank0
    assert rank0.count("step ") == STEPS // 20 and "final test accuracy" in rank0
    assert rank1 == ""
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["steps"] == STEPS == len(result["history"])
    assert result["loss_scale_variables"] == ["loss_scale/current_loss_scale:0"]
    assert all(entry["loss_scale"] >= 1 for entry in result["history"])
    assert result["test_accuracy"] > 0.8
