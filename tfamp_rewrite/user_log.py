"""INFO lines that reach the user's log, as TensorFlow's own pass summary does.

NVIDIA's TensorFlow 1.15 logs its AMP pass summary through TensorFlow's C++ log, which
prints INFO and up on stderr unless ``TF_CPP_MIN_LOG_LEVEL`` raises the bar (1: warnings
and up, 2: errors, 3: nothing).  TF1 programs rarely configure Python's ``logging``, and
unconfigured, Python drops INFO records.  So ``log_info``:

    if the program configured logging (a handler on the "tfamp_rewrite" logger or above):
        logger.info(message)        # its handlers and levels decide, as for any library
    elif TF_CPP_MIN_LOG_LEVEL is 0 (or unset):
        print message on stderr     # what TensorFlow's C++ INFO line would do
"""
from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "tfamp_rewrite"


def info_quieted(environ=None) -> bool:
    """True when ``TF_CPP_MIN_LOG_LEVEL`` (1, 2 or 3) hides TensorFlow's INFO lines."""
    environ = os.environ if environ is None else environ
    value = environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip()
    return value.isdigit() and int(value) >= 1


def log_info(message: str) -> None:
    """Logs ``message`` at INFO where the user will see it (see the module docstring)."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.hasHandlers():
        logger.info(message)
    elif not info_quieted():
        print(message, file=sys.stderr, flush=True)
