"""Child process running graphs in one TensorFlow for a parent process that holds another.

``python runtime_server.py tf115 TENSORFLOW_CORE SHIM``: TensorFlow 1.15 through its C API
(``tf115_capi.Tf115Runtime``); ``python runtime_server.py tf2``: this Python's TensorFlow 2.x
(``tf2_runtime.Tf2Runtime``). Either answers the same requests until its stdin closes: a
request is a pickled ``(method, args, kwargs)``, the answer a pickled ``("ok", result)`` or
``("error", message)``. The protocol has stdout to itself: file descriptor 1 is pointed at
stderr before TensorFlow loads, so nothing TensorFlow prints can corrupt it.
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

METHODS = ("version", "build_facts", "all_op_list", "export_graph_def", "load_library",
           "library_string", "set_environment", "registered_kernels", "run", "run_steps")


def _runtime(argv):
    if argv[1] == "tf115":
        if "tensorflow" in sys.modules:  # two TensorFlow runtimes in one process clash
            raise SystemExit("runtime_server: TensorFlow 2.x is already imported here")
        from tf115_capi import Tf115Runtime

        return Tf115Runtime(Path(argv[2]), Path(argv[3]))
    from tf2_runtime import Tf2Runtime

    return Tf2Runtime()


def main(argv) -> int:
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    runtime = _runtime(argv)
    refused = runtime.errors + (AttributeError,)
    while True:
        try:
            method, args, kwargs = pickle.load(requests)
        except EOFError:
            return 0
        try:
            if method not in METHODS or not hasattr(runtime, method):
                raise AttributeError("runtime_server: %s has no request %r" % (argv[1], method))
            answer = ("ok", getattr(runtime, method)(*args, **kwargs))
        except refused as error:
            answer = ("error", str(error))
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
