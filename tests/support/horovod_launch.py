"""Runs a Python program as N Horovod ranks (Gloo) on 127.0.0.1 -- ``horovodrun`` for tests.

``run_ranks(program_argv, ranks=2, timeout=...)`` starts one process per rank with the
environment ``horovodrun --gloo -np N -H localhost:N`` would give it, and returns each
rank's ``RankResult(returncode, stdout, stderr)``, in rank order (by default it raises
``RanksFailed`` if a rank failed).  Differences from ``horovodrun``, on purpose:

* the rendezvous server listens on 127.0.0.1 only (``horovodrun``'s listens on every
  interface) and Gloo talks over ``lo``;
* every rank runs in its own process group; when a rank fails the others are killed at
  once (they would wait for it in their next collective), and when ``timeout`` passes or
  the launcher is interrupted every group is killed; if the launching process itself is
  killed, the kernel kills the ranks.  No rank outlives a run;
* output goes to files, so a rank that writes a lot cannot block on a full pipe while its
  peer waits for it in a collective.
"""
from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

RankResult = collections.namedtuple("RankResult", ["returncode", "stdout", "stderr"])

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
# Loaded here: the child of a fork, with the rendezvous thread running, should only call it.
_LIBC = ctypes.CDLL(None, use_errno=True)


class RanksFailed(RuntimeError):
    """Ranks were still running at the timeout (and were killed) or, if checked, failed.

    ``results`` holds every rank's ``RankResult``; the message ends with their stderr.
    """

    def __init__(self, problem, results):
        tails = "\n".join(f"--- rank {rank} stderr:\n{r.stderr[-2000:]}" for rank, r in enumerate(results))
        super().__init__(f"{problem}\n{tails}")
        self.results = results


def _die_with_parent():
    """In the child: get SIGKILL when the launching process dies, whatever killed it."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _rendezvous_server(ranks):
    server = RendezvousHTTPServer((LOOPBACK, 0), RendezvousHandler, 0)
    slots = get_host_assignments(parse_hosts(f"localhost:{ranks}"), ranks)
    server.init(slots)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, slots


def _wait(processes, deadline):
    """Waits until all have exited or one has failed; False if the deadline came first."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes) or any(codes):
            return True
        time.sleep(0.1)
    return False


def run_ranks(program_argv, ranks=2, timeout=300, env=None, check=True):
    """Runs ``python program_argv...`` as ``ranks`` Horovod ranks; see the module docstring.

    ``env`` adds to (or, with a None value, removes from) this process's environment.
    Raises ``RanksFailed`` if they have not all finished after ``timeout`` seconds, or
    with ``check`` if one exited with a non-zero status.
    """
    base_env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, value in (env or {}).items():
        if value is None:
            base_env.pop(name, None)
        else:
            base_env[name] = str(value)
    server, slots = _rendezvous_server(ranks)
    run_env = {k: str(v) for k, v in create_run_env_vars(LOOPBACK, ["lo"], server.server_address[1]).items()}
    processes, files = [], []
    try:
        for slot in slots:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files.append((out, err))
            processes.append(subprocess.Popen(
                [sys.executable, *program_argv],
                env={**base_env, **run_env, **create_slot_env_vars(slot)},
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, preexec_fn=_die_with_parent,
            ))
        finished = _wait(processes, time.monotonic() + timeout)
    finally:
        for process in processes:  # a no-op for ranks that exited; kills the rest
            _kill_group(process)
        server.shutdown()
        server.server_close()
    results = []
    for process, (out, err) in zip(processes, files):
        out.seek(0)
        err.seek(0)
        results.append(RankResult(process.returncode, out.read(), err.read()))
        out.close()
        err.close()
    if not finished:
        raise RanksFailed(f"Horovod ranks still running after {timeout} s; killed them.", results)
    failed = [rank for rank, result in enumerate(results) if result.returncode != 0]
    if check and failed:
        raise RanksFailed(f"Horovod rank(s) {failed} of {ranks} failed: exit statuses "
                          f"{[r.returncode for r in results]}.", results)
    return results
