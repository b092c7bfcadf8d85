"""Two real Horovod ranks (Gloo, 127.0.0.1) with LossScaleOptimizer in either wrap order.

Runs only where Horovod is installed (it is not a test dependency: it builds from
source for minutes).  Rank 1 alone overflows at step 2; both ranks must skip that step,
lower the scale and end with identical variables, and neither may hang.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("horovod.tensorflow")
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import (
    RendezvousHandler,
    RendezvousHTTPServer,
)
from loss_scaling_problems import SCALE

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_worker.py")
RANKS = 2


def run_ranks(*arguments):
    """Runs the worker on RANKS local ranks; returns each rank's parsed JSON output."""
    # horovodrun's rendezvous server listens on every interface; this one only on loopback.
    server = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
    slots = get_host_assignments(parse_hosts(f"localhost:{RANKS}"), RANKS)
    server.init(slots)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        shared = create_run_env_vars("127.0.0.1", ["lo"], server.server_address[1])
        workers = [
            subprocess.Popen(
                [sys.executable, WORKER, *arguments],
                env={**os.environ, **{k: str(v) for k, v in shared.items()},
                     **create_slot_env_vars(slot)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for slot in slots
        ]
        outputs = [worker.communicate(timeout=240) for worker in workers]
    finally:
        server.shutdown()
    for worker, (_, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-3000:]
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


@pytest.mark.parametrize("order", ["hvd_outer", "hvd_inner"])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(order):
    rank0, rank1 = run_ranks(order)
    assert rank0 == rank1
    before, skipped, applied = rank0
    assert skipped["w"] == before["w"] and skipped["global_step"] == before["global_step"] == 1
    assert skipped[SCALE] == before[SCALE] / 2
    assert applied["global_step"] == 2 and applied["w"] != skipped["w"]
