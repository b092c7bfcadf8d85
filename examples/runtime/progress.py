"""Progress lines and the final summary line, in the layout of NVIDIA's example scripts.

Every line is ``<timestamp> - <step> <key> : <value> ...``: ``(epoch, step)`` for a
progress line, ``Summary:`` for the last one, e.g.::

    2024-05-01 12:00:03 - (0, 20) imgs_per_sec : 781.20 loss : 7.1234 loss_scale : 32768
    2024-05-01 12:00:09 - Summary: train_throughput : 780.52 images/s train_steps : 500

Throughput counts only the steps after the warm-up steps (their time includes graph
rewriting, XLA compilation and the first allocations).
"""
from __future__ import annotations

import sys
import time
from typing import Dict, Optional


def format_value(value) -> str:
    """Numbers the way the progress lines print them (loss scales as integers)."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) >= 1:
            return "%d" % value
        return "%.4f" % value if abs(value) < 100 else "%.2f" % value
    return str(value)


def format_line(step_label: str, data: Dict[str, object]) -> str:
    """``<timestamp> - <step_label> key : value key : value ...``."""
    fields = " ".join("%s : %s" % (key, format_value(value)) for key, value in data.items())
    return "%s - %s %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), step_label, fields)


class ThroughputMeter:
    """Samples per second over the steps after ``warmup_steps``, and per-step latencies."""

    def __init__(self, batch_size: int, warmup_steps: int):
        self.batch_size = batch_size
        self.warmup_steps = warmup_steps
        self.steps_seen = 0
        self.latencies = []  # seconds, counted steps only

    def record(self, seconds: float) -> None:
        """Records one step that took ``seconds``."""
        if self.steps_seen >= self.warmup_steps:
            self.latencies.append(seconds)
        self.steps_seen += 1

    @property
    def counted_steps(self) -> int:
        return len(self.latencies)

    def throughput(self) -> Optional[float]:
        """Samples/s over the counted steps, or None if warm-up took every step."""
        total = sum(self.latencies)
        return self.batch_size * len(self.latencies) / total if total > 0 else None

    def latency_ms(self, quantile: float) -> Optional[float]:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        index = min(len(ordered) - 1, int(round(quantile * (len(ordered) - 1))))
        return 1000.0 * ordered[index]


class ProgressPrinter:
    """Prints a progress line every ``display_every`` steps and the summary line.

    ``rate_key`` names the per-line rate (``imgs_per_sec``, ``seq_per_sec``) and
    ``unit`` the summary's (``images/s``); the rate on a progress line covers the steps
    since the previous line.
    """

    def __init__(self, batch_size: int, steps_per_epoch: int, display_every: int,
                 rate_key: str, unit: str, stream=None):
        self.batch_size = batch_size
        self.steps_per_epoch = max(1, steps_per_epoch)
        self.display_every = max(1, display_every)
        self.rate_key = rate_key
        self.unit = unit
        self.stream = stream or sys.stdout
        self._window_steps = 0
        self._window_seconds = 0.0

    def step(self, step: int, seconds: float, values: Dict[str, object], last: bool = False) -> None:
        """Accounts for step ``step`` (1-based) and prints its line when one is due."""
        self._window_steps += 1
        self._window_seconds += seconds
        if step % self.display_every and not last:
            return
        rate = self.batch_size * self._window_steps / max(self._window_seconds, 1e-9)
        self._window_steps, self._window_seconds = 0, 0.0
        label = "(%d, %d)" % ((step - 1) // self.steps_per_epoch, step)
        self.print(format_line(label, dict([(self.rate_key, "%.2f" % rate)] + list(values.items()))))

    def summary(self, data: Dict[str, object], throughput_key: str = "train_throughput",
                throughput: Optional[float] = None) -> None:
        """The ``Summary:`` line: ``throughput`` first (None: no step after the warm-up), then ``data``."""
        if throughput is None:
            fields = ["%s : n/a (every step was a warm-up step)" % throughput_key]
        else:
            fields = ["%s : %.2f %s" % (throughput_key, throughput, self.unit)]
        fields.extend("%s : %s" % (key, format_value(value)) for key, value in data.items())
        self.print("%s - Summary: %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), " ".join(fields)))

    def print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def quiet_tensorflow() -> None:
    """Hides TensorFlow's deprecation notices about the TF1 APIs the examples use on purpose."""
    import warnings

    import tensorflow as tf

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed.*")
