"""One run of an example: build the graph for ``--mode``, run it, log, write results.

A script describes its model as a ``Task`` and calls ``run(task, args)``:

* ``training_benchmark`` / ``train``: ``task.dataset`` -> ``task.loss_and_metrics`` ->
  ``task.optimizer`` (wrapped for ``--use_tf_amp``) -> ``minimize`` after the
  ``UPDATE_OPS``; ``train`` resumes from and saves checkpoints in ``--results_dir``.
* ``evaluate``: restores the latest checkpoint of ``--results_dir`` and averages the
  task's metrics over the batches.

``run`` returns the results as a dict (also written to ``results_<mode>.json`` in
``--results_dir``): throughput after the warm-up steps, per-step ``history`` of loss
and loss scale, the rewrite's counters and, with ``--step_stats``, what the executed
graph ran (``runtime.executed_graph``).  Each run builds its own ``tf.Graph`` and
leaves the process-wide AMP switch as it found it.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, Tuple

import tensorflow as tf

from runtime import executed_graph, flags, switches
from runtime.progress import ProgressPrinter, ThroughputMeter, quiet_tensorflow
from tfamp_rewrite.training import devices

tf1 = tf.compat.v1


class Task:
    """What a script tells the runner about its model (override every method)."""

    name = "model"
    rate_key = "imgs_per_sec"   # the rate on progress lines
    unit = "images/s"           # the throughput unit on the summary line

    def describe_data(self, training: bool) -> str:
        """A few words on the data, e.g. 'synthetic' or the TFRecord files used."""
        raise NotImplementedError

    def examples_per_epoch(self, training: bool) -> int:
        raise NotImplementedError

    def dataset(self, training: bool, batch_size: int) -> tf.data.Dataset:
        """Batches of ``(features, labels)``, repeating for ever."""
        raise NotImplementedError

    def loss_and_metrics(self, features, labels, training: bool) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
        """The scalar loss to minimise and scalar metrics averaged by ``evaluate``."""
        raise NotImplementedError

    def optimizer(self, args, global_step, total_steps: int):
        """``(tf.compat.v1.train.Optimizer, learning_rate tensor)``."""
        raise NotImplementedError


def run(task: Task, args) -> dict:
    """Runs ``args.mode`` for ``task``; returns the results (see the module docstring)."""
    quiet_tensorflow()
    notes = []
    # First: TensorFlow may read TF_XLA_FLAGS while the graph is built.
    config = switches.xla_session_config(args.use_xla, notes)
    with switches.amp_switch_restored(), tf.Graph().as_default():
        tf1.set_random_seed(args.seed)
        if args.mode == "evaluate":
            return _evaluate(task, args, config, notes)
        return _train(task, args, config, notes)


def _header(printer, task, args, steps, training, notes):
    precision = "float32"
    if args.use_tf_amp:
        emulated = devices.session_numerics() == "emulate"
        precision = "AMP (float16 rewrite%s%s)" % (", Tensor Core numerics emulated" if emulated else "",
                                                 ", dynamic loss scaling" if training else "")
    printer.print("%s %s: batch size %d, %d steps (%d warm-up), %s, XLA %s, data: %s" % (
        task.name, args.mode, args.batch_size, steps, min(args.warmup_steps, steps), precision,
        "on" if args.use_xla else "off", task.describe_data(training)))
    for note in notes:
        printer.print(note)


class _TrainingGraph:
    """The training graph's parts the loop runs (built in the default graph)."""

    def __init__(self, task, args, steps):
        self.iterator = tf1.data.make_initializable_iterator(task.dataset(True, args.batch_size))
        features, labels = self.iterator.get_next()
        self.global_step = tf1.train.get_or_create_global_step()
        self.loss, _ = task.loss_and_metrics(features, labels, training=True)
        optimizer, self.learning_rate = task.optimizer(args, self.global_step, steps)
        optimizer = switches.wrap_optimizer(optimizer, args.use_tf_amp)
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            self.train_op = optimizer.minimize(self.loss, global_step=self.global_step)
        self.loss_scale = switches.loss_scale_tensor(tf1.get_default_graph())
        tf1.summary.scalar("loss", self.loss)
        tf1.summary.scalar("learning_rate", self.learning_rate)
        self.summary_op = tf1.summary.merge_all()  # includes the loss scale's own summary
        self.saver = tf1.train.Saver(max_to_keep=2)
        self.init = [tf1.global_variables_initializer(), tf1.local_variables_initializer(),
                     self.iterator.initializer]

    def fetches(self, with_summary: bool) -> dict:
        fetches = {"train": self.train_op, "loss": self.loss, "step": self.global_step,
                   "lr": self.learning_rate}
        if self.loss_scale is not None:
            fetches["loss_scale"] = self.loss_scale
        if with_summary:
            fetches["summary"] = self.summary_op
        return fetches


def _timed_steps(session, first, last, fetches_for_step, meter):
    """Runs steps ``first..last`` (1-based), timing each; yields ``(step, values, seconds)``."""
    for step in range(first, last + 1):
        fetches = fetches_for_step(step)
        tick = time.time()
        values = session.run(fetches)
        seconds = time.time() - tick
        meter.record(seconds)
        yield step, values, seconds


def _after_steps(session, args, fetches, printer):
    """The traced step (``--step_stats``) and the session's rewrite report: ``(stats, report)``."""
    stats = None
    if args.step_stats:
        _, stats = executed_graph.trace_step(session, fetches, args.batch_size)
        printer.print(stats.line())
    reports = getattr(session, "rewrite_reports", None)
    return stats, (reports[0] if reports else None)


def _train(task, args, config, notes):
    steps_per_epoch = flags.total_steps(1, "epoch", args.batch_size, task.examples_per_epoch(True))
    steps = flags.total_steps(args.num_iter, args.iter_unit, args.batch_size, task.examples_per_epoch(True))
    parts = _TrainingGraph(task, args, steps)
    printer = ProgressPrinter(args.batch_size, steps_per_epoch, args.display_every, task.rate_key, task.unit)
    meter = ThroughputMeter(args.batch_size, args.warmup_steps)
    writer = tf1.summary.FileWriter(args.results_dir, tf1.get_default_graph()) if args.results_dir else None

    def summary_due(step):
        return writer is not None and (step % args.display_every == 0 or step == steps)

    history = []
    _header(printer, task, args, steps, True, notes)
    with tf1.Session(config=config) as session:
        session.run(parts.init)
        printer.print(switches.rewrite_line(session))
        first = _restore(session, parts.saver, args) + 1 if args.mode == "train" else 1
        started = time.time()
        for step, values, seconds in _timed_steps(session, first, steps,
                                                  lambda s: parts.fetches(summary_due(s)), meter):
            scale = float(values["loss_scale"]) if "loss_scale" in values else None
            history.append({"step": step, "loss": float(values["loss"]), "loss_scale": scale})
            shown = {"loss": float(values["loss"]), "learning_rate": float(values["lr"])}
            if scale is not None:
                shown["loss_scale"] = scale
            printer.step(step, seconds, shown, last=step == steps)
            if "summary" in values:
                writer.add_summary(values["summary"], int(values["step"]))
        elapsed = time.time() - started
        stats, rewrite = _after_steps(session, args, [parts.train_op, parts.loss], printer)
        if args.mode == "train" and args.results_dir:
            path = parts.saver.save(session, os.path.join(args.results_dir, "model.ckpt"),
                                    global_step=parts.global_step)
            printer.print("checkpoint saved: %s" % path)
    if writer is not None:
        writer.close()

    result = _result(task, args, steps, meter, elapsed, stats, rewrite)
    last = history[-1] if history else {"loss": None, "loss_scale": None}
    result.update(history=history, final_loss=last["loss"], loss_scale=last["loss_scale"])
    summary = {"train_steps": len(history), "final_loss": last["loss"]}
    if last["loss_scale"] is not None:
        summary["loss_scale"] = last["loss_scale"]
    printer.summary(summary, "train_throughput", result["throughput"])
    return _written(result, args)


def _restore(session, saver, args) -> int:
    """Restores the latest checkpoint of ``--results_dir``; returns its global step (0 if none)."""
    latest = tf1.train.latest_checkpoint(args.results_dir) if args.results_dir else None
    if latest is None:
        return 0
    saver.restore(session, latest)
    step = int(session.run(tf1.train.get_global_step()))
    print("restored %s (step %d)" % (latest, step), flush=True)
    return step


def _evaluate(task, args, config, notes):
    steps = flags.total_steps(args.num_iter, args.iter_unit, args.batch_size, task.examples_per_epoch(False))
    iterator = tf1.data.make_initializable_iterator(task.dataset(False, args.batch_size))
    features, labels = iterator.get_next()
    loss, metrics = task.loss_and_metrics(features, labels, training=False)
    metrics = dict(metrics, loss=loss)
    saver = tf1.train.Saver()
    latest = tf1.train.latest_checkpoint(args.results_dir)
    if latest is None:
        raise SystemExit("no checkpoint in %s: run --mode train --results_dir %s first"
                         % (args.results_dir, args.results_dir))

    printer = ProgressPrinter(args.batch_size, steps, args.display_every, task.rate_key, task.unit)
    meter = ThroughputMeter(args.batch_size, args.warmup_steps)
    _header(printer, task, args, steps, False, notes)
    sums = {name: 0.0 for name in metrics}
    with switches.session_class(args.use_tf_amp)(config=config) as session:
        session.run(iterator.initializer)
        saver.restore(session, latest)
        printer.print("restored %s" % latest)
        printer.print(switches.rewrite_line(session))
        started = time.time()
        for step, values, seconds in _timed_steps(session, 1, steps, lambda _: metrics, meter):
            values = {name: float(value) for name, value in values.items()}
            for name, value in values.items():
                sums[name] += value
            printer.step(step, seconds, values, last=step == steps)
        elapsed = time.time() - started
        stats, rewrite = _after_steps(session, args, list(metrics.values()), printer)

    result = _result(task, args, steps, meter, elapsed, stats, rewrite)
    result["metrics"] = {name: total / steps for name, total in sums.items()}
    printer.summary({"eval_" + name: value for name, value in result["metrics"].items()},
                    "eval_throughput", result["throughput"])
    return _written(result, args)


def _result(task, args, steps, meter, elapsed, stats, rewrite) -> dict:
    return {
        "model": task.name,
        "mode": args.mode,
        "precision": "amp" if args.use_tf_amp else "fp32",
        "xla": bool(args.use_xla),
        "batch_size": args.batch_size,
        "steps": steps,
        "warmup_steps": args.warmup_steps,
        "seconds": elapsed,
        "throughput": meter.throughput(),
        "unit": task.unit,
        "latency_ms": {"p50": meter.latency_ms(0.5), "p90": meter.latency_ms(0.9),
                       "p99": meter.latency_ms(0.99)},
        "rewrite": None if rewrite is None else {
            "nodes_total": rewrite.nodes_total, "nodes_converted": rewrite.nodes_converted,
            "casts_added": rewrite.casts_added, "dtype": rewrite.dtype, "target": rewrite.target,
            "numerics": rewrite.numerics},
        "executed_graph": None if stats is None else stats.to_dict(),
    }


def _written(result: dict, args) -> dict:
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        with open(os.path.join(args.results_dir, "results_%s.json" % args.mode), "w") as handle:
            json.dump(result, handle, indent=1)
    return result
