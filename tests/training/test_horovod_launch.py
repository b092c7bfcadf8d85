"""horovod_launch: ranks that fail or hang are killed, with every process they started."""
from __future__ import annotations

import signal
import time

import pytest

# Each rank starts a child that would sleep for ten minutes, prints its pid and marks
# itself started, then exits with 3 if it is the rank named by argv[1], else sleeps for
# ten minutes as well. The failing rank waits for every rank's mark first, so that no
# rank is killed before it has printed its child's pid (a loaded machine starts ranks
# seconds apart).
RANK = """
import os, pathlib, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
marks = pathlib.Path(__file__).parent
(marks / ("started.%s" % os.environ["HOROVOD_RANK"])).touch()
if os.environ["HOROVOD_RANK"] == sys.argv[1]:
    while len(list(marks.glob("started.*"))) < int(os.environ["HOROVOD_SIZE"]):
        time.sleep(0.05)
    sys.exit(3)
time.sleep(600)
"""


def rank_program(tmp_path):
    path = tmp_path / "rank.py"
    path.write_text(RANK)
    return str(path)


def children(results):
    return [int(result.stdout.split()[0]) for result in results]


def is_gone(pid):
    """True once ``pid`` has exited (a zombie waiting for init counts as exited)."""
    for _ in range(50):
        try:
            with open("/proc/%d/stat" % pid) as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_a_failing_rank_gets_the_others_killed_with_their_children(horovod_ranks, tmp_path):
    results = horovod_ranks([rank_program(tmp_path), "1"], ranks=2, timeout=300, check=False)
    assert [result.returncode for result in results] == [-signal.SIGKILL, 3]
    assert all(is_gone(pid) for pid in children(results))


def test_ranks_still_running_at_the_timeout_are_killed_with_their_children(horovod_ranks, tmp_path):
    with pytest.raises(RuntimeError, match="still running after 10 s") as raised:
        horovod_ranks([rank_program(tmp_path), "none"], ranks=2, timeout=10, check=False)
    results = raised.value.results
    assert [result.returncode for result in results] == [-signal.SIGKILL] * 2
    pids = children(results)
    assert len(pids) == 2 and all(is_gone(pid) for pid in pids)
