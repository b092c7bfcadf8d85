"""A corpus of TF1-era training programs (``tests/programs/*.py``) run as users run them.

Each program is a plain script -- TF1 behaviour, its own seeded data, ``--seed`` -- whose
last stdout line is ``final loss: <float>``.  It runs in one of three modes:

* ``fp32``: ``python program.py``;
* ``zero_code``: the same with ``TF_ENABLE_AUTO_MIXED_PRECISION=1 TFAMP_REWRITE_TARGET=cpu
  TFAMP_REWRITE_NUMERICS=emulate`` (NVIDIA's variable; the start-up hook does the rest);
* ``tfamp_run``: ``python -m tfamp_rewrite.training.run --target cpu --numerics emulate program.py``.

``run_program`` runs one program in a new process, as a user does; ``run_batch`` runs many in
one new process in the mode, one after the other, each in a graph of its own and as
``__main__`` with its own ``sys.argv``.  A process's start (importing TensorFlow, seconds)
costs more than most programs' training, so the suite runs zero-code AMP -- the path users
take -- one process per program, and the fp32 references and ``tfamp-run`` as one batch
each (``run_batches``); both AMP modes are held to the same tolerance (``comparison_problems``).

Children get ``TF_CPP_MIN_LOG_LEVEL=0``, so each session that rewrites logs its summary line
(``tfamp_rewrite: session graph rewritten: converted N of M eligible nodes ...; compat=...``);
an AMP run with no such line, or with 0 nodes converted, did not run the rewrite.  The
programs disable v2 behaviour themselves, so ``TFAMP_TEST_TF1_BEHAVIOR`` changes nothing here.

    python tests/support/program_corpus.py [--only NAME] [--seed N] [--sequential]
    python tests/support/program_corpus.py --spread [--only NAME]   # fp32 over seeds 0..4

The first prints the comparison table; ``--spread`` re-measures what the tolerances rest on.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

SUPPORT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(SUPPORT))
PROGRAMS_DIR = os.path.join(REPO, "tests", "programs")

MODES = ("fp32", "zero_code", "tfamp_run")
AMP_MODES = ("zero_code", "tfamp_run")
LOSS_FLOOR = 0.01  # the denominator of the relative difference is at least this
TOLERANCE_FLOOR = 0.05
RUN_TIMEOUT_S = 300

# Variables that switch mixed precision on or steer it: cleared for every child, then set
# per mode, so that an fp32 run is fp32 whatever the parent process has set.
_AMP_VARIABLES = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
                  "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING", "TFAMP_REWRITE_TARGET",
                  "TFAMP_REWRITE_NUMERICS", "TFAMP_REWRITE_DTYPE", "TFAMP_REWRITE_COMPAT")
_LAUNCHER = ["-m", "tfamp_rewrite.training.run", "--target", "cpu", "--numerics", "emulate"]
_REWRITE_LINE = re.compile(r"tfamp_rewrite: session graph rewritten: converted (\d+) of (\d+) eligible nodes"
                           r".*?compat=(\S+)")
_FINAL_LOSS = re.compile(r"^final loss: (\S+)$")
_CURVE_POINT = re.compile(r"^step (\d+) .*?loss ([-+\w.]+)")


@dataclass(frozen=True)
class Program:
    """One program of the corpus and how closely its AMP runs must follow fp32."""

    name: str
    pattern: str
    tolerance: float  # largest allowed |amp - fp32| / max(|fp32|, LOSS_FLOOR) at the same seed
    exercises: tuple  # op types its sessions' graphs must hold under TF1 behaviour (what it stands for)
    optimizers: int = 1  # tf.compat.v1.train.Optimizers it makes (each gets its own loss scale)
    must_heal: bool = False  # AMP skips its steps until the session heals it (never silently)
    needs_estimator: bool = False
    needs_tf1_keras: bool = False  # tf.keras with graph mode (Keras 2), not Keras 3
    resource_variables: bool = False  # its variables are resource ones (Keras' are, in TF 1.15 too)

    @property
    def path(self) -> str:
        return os.path.join(PROGRAMS_DIR, self.name + ".py")


# Tolerances, measured with ``--spread`` and the table at seed 0 (TensorFlow 2.15.1 CPU, a
# 2-core AVX-512 machine).  "spread" is the largest |loss(seed) - loss(seed 0)| / |loss(seed 0)|
# of fp32 over seeds 1..4 (the losses of seeds 0..4 are listed); "amp" is the larger of the two
# AMP runs' relative difference from fp32 at seed 0 (zero-code and tfamp-run agree to the bit).
# Tolerance = max(TOLERANCE_FLOOR, 3 x max(spread, amp)), rounded up: an AMP run may end as far
# from fp32 as another seed does (short runs of chaotic training amplify the half rounding as
# they amplify a change of seed), with room for other CPUs' float32 kernels; a diverged or
# stalled run (nan, or a loss near chance, e.g. ln(4) = 1.39 for raw_conv_net) is far outside.
CORPUS = (
    # fp32 by seed 0..4: 0.408, 0.503, 0.350, 0.538, 0.404; spread 0.318, amp 0.102 -> 3 x 0.318
    Program("raw_conv_net", "TF1 tf.Variable weights, conv2d/max_pool, Momentum", tolerance=0.96,
            exercises=("VariableV2", "Conv2D", "MaxPool", "SoftmaxCrossEntropyWithLogits", "ApplyMomentum")),
    # fp32 by seed 0..4: 8.92e4, 8.23e4, 8.13e4, 6.33e4, 7.55e4; spread 0.290, amp 0.015 (after 3
    # heals) -> 3 x 0.290; a run that stays skipped ends near its first loss, 2.5e5: 1.8 away
    Program("big_init_conv_net", "the conv net with random_normal(stddev=1) weights: logits ~1e5",
            tolerance=0.87, exercises=("VariableV2", "Conv2D", "MaxPool", "ApplyGradientDescent"),
            must_heal=True),
    # fp32 by seed 0..4: 0.399, 0.426, 0.424, 0.431, 0.513; spread 0.284, amp 0.005 -> 3 x 0.284
    Program("mlp_layers", "tf.compat.v1.layers.dense MLP, Adam, global_step", tolerance=0.86,
            exercises=("VariableV2", "MatMul", "SparseSoftmaxCrossEntropyWithLogits", "ApplyAdam")),
    # fp32 by seed 0..4: 2.842, 2.796, 2.829, 2.817, 2.822; spread 0.016, amp 2e-05 -> 3 x 0.016 (floor)
    Program("char_rnn", "MultiRNNCell LSTM state tuple fed back, tf.gradients + clipping", tolerance=0.05,
            exercises=("VariableV2", "Enter", "Exit", "Switch", "Merge", "NextIteration", "TensorArrayV3",
                       "L2Loss", "ApplyAdam")),
    # fp32 by seed 0..4: 0.408, 0.430, 0.436, 0.441, 0.416; spread 0.081, amp 3e-05 -> 3 x 0.081
    Program("bilstm_classifier", "bidirectional_dynamic_rnn with sequence_length", tolerance=0.25,
            exercises=("VariableV2", "Enter", "Exit", "ReverseSequence", "ApplyRMSProp")),
    # fp32 by seed 0..4: 2.188, 2.017, 2.113, 2.237, 2.228; spread 0.078, amp 0.008 -> 3 x 0.078
    Program("gan_two_optimizers", "GAN, two optimizers with var_list, alternating", tolerance=0.24,
            exercises=("VariableV2", "LeakyRelu", "Log1p", "ApplyAdam"), optimizers=2),
    # fp32 by seed 0..4: 17.62, 18.16, 17.81, 17.35, 17.87; spread 0.030, amp 0.017 -> 3 x 0.030
    Program("vae", "VAE, reparameterisation, KL, log(1e-10 + p) reconstruction", tolerance=0.10,
            exercises=("VariableV2", "Softplus", "RandomStandardNormal", "Sigmoid", "Log", "Exp",
                       "ApplyAdam")),
    # fp32 by seed 0..4: 0.221, 0.239, 0.221, 0.242, 0.267; spread 0.209, amp 0.176 -> 3 x 0.209
    Program("estimator_dnn", "Estimator model_fn + numpy_input_fn", tolerance=0.63,
            exercises=("VariableV2", "MatMul", "FIFOQueueV2", "QueueDequeueUpToV2", "ApplyAdagrad", "SaveV2"),
            needs_estimator=True),
    # fp32 by seed 0..4: 0.386, 0.359, 0.399, 0.398, 0.387; spread 0.071, amp 3e-04 -> 3 x 0.071
    Program("text_cnn", "text CNN: embedding, conv + max-pool over time, dropout", tolerance=0.22,
            exercises=("VariableV2", "GatherV2", "Conv2D", "MaxPool", "RandomUniform", "L2Loss",
                       "ApplyAdam")),
    # fp32 by seed 0..4: 0.473, 0.469, 0.605, 0.426, 0.571; spread 0.281, amp 0.065 -> 3 x 0.281
    Program("resnet_queue_bn", "ResNet, batch_normalization + UPDATE_OPS, queue runners", tolerance=0.85,
            exercises=("VariableV2", "FIFOQueueV2", "QueueDequeueManyV2", "Conv2D", "FusedBatchNormV3",
                       "AssignSub", "ApplyMomentum")),
    # fp32 by seed 0..4: 0.294, 0.230, 0.301, 0.244, 0.226; spread 0.230, amp 0.133 -> 3 x 0.230
    Program("seq2seq_attention", "seq2seq, hand-written Luong attention, decoder in while_loop",
            tolerance=0.69,
            exercises=("VariableV2", "Enter", "Exit", "Switch", "Merge", "NextIteration", "LoopCond",
                       "TensorArrayV3", "StackPushV2", "StackPopV2", "ApplyAdam")),
    # fp32 by seed 0..4: 0.852, 0.864, 0.812, 0.885, 0.810; spread 0.049, amp 5e-06 -> 3 x 0.049
    Program("monitored_softmax_regression", "softmax regression, MonitoredTrainingSession + hooks",
            tolerance=0.15, exercises=("VariableV2", "MatMul", "ApplyGradientDescent")),
    # fp32 by seed 0..4: 0.3371, 0.3413, 0.3322, 0.3257, 0.3327; spread 0.034, amp 0.002 -> 3 x 0.034
    Program("keras_fit", "tf.keras compile/fit/evaluate/predict with a tf.compat.v1.train optimizer",
            tolerance=0.11, exercises=("VarHandleOp", "MatMul", "Softmax", "ResourceApplyAdam"),
            needs_tf1_keras=True, resource_variables=True),
)


def program(name: str) -> Program:
    """The corpus program called ``name``; ``ValueError`` naming the known ones otherwise."""
    for candidate in CORPUS:
        if candidate.name == name:
            return candidate
    raise ValueError("no program %r in the corpus; known: %s" % (name, ", ".join(p.name for p in CORPUS)))


def estimator_unavailable_reason():
    """Why ``tf.compat.v1.estimator`` cannot be used here (TensorFlow >= 2.16 has none), or None."""
    import tensorflow as tf

    try:
        available = getattr(tf.compat.v1, "estimator", None) is not None
    except ImportError as error:  # the lazy loader of tensorflow_estimator failing
        return "tf.compat.v1.estimator cannot be imported (%s)" % error
    if not available:
        return "TensorFlow %s has no tf.compat.v1.estimator (removed in 2.16)" % tf.__version__
    return None


def tf1_keras_unavailable_reason():
    """Why ``tf.keras`` cannot build TF1 graphs here (Keras 3 has no graph mode), or None."""
    import tensorflow as tf

    package = tf.keras.Sequential.__module__.split(".")[0]  # keras, tf_keras, or tensorflow in 1.x
    version = getattr(sys.modules[package], "__version__", "")
    if not version.startswith(("1.", "2.")):
        return ("tf.keras is Keras %s, which has no TF1 graph mode (TF_USE_LEGACY_KERAS=1 with "
                "tf-keras)" % version)
    return None


def unavailable_reason(entry: Program):
    """Why ``entry`` cannot run with the installed TensorFlow, or None."""
    if entry.needs_estimator:
        return estimator_unavailable_reason()
    return tf1_keras_unavailable_reason() if entry.needs_tf1_keras else None


@dataclass
class RunResult:
    """What one run of one program in one mode did."""

    name: str
    mode: str
    returncode: int
    seconds: float
    final_loss: float = float("nan")
    nodes_converted: int = 0  # the largest over the run's rewritten sessions
    rewrites: int = 0  # how many session rewrites it logged
    compat: str = ""
    curve: list = field(default_factory=list)  # (step, loss) of the "step N ... loss X" lines
    product_messages: list = field(default_factory=list)  # other stderr lines naming tfamp
    heals: int = 0  # "tfamp_rewrite: healed: ..." lines: nodes the session kept float32
    stdout: str = ""
    stderr: str = ""
    graph: dict = field(default_factory=dict)  # batch runs: what _run_here records of its sessions' graphs

    @property
    def tail(self) -> str:
        return "--- stdout ---\n%s\n--- stderr ---\n%s" % (self.stdout[-2000:], self.stderr[-4000:])

    def problem(self):
        """Why this run does not count as a finished run in its mode, or None."""
        if self.returncode != 0:
            return "%s/%s exited with status %d" % (self.name, self.mode, self.returncode)
        if self.final_loss != self.final_loss and "final loss: nan" not in self.stdout:
            return "%s/%s printed no 'final loss: <float>' as its last line" % (self.name, self.mode)
        if self.mode in AMP_MODES and self.nodes_converted <= 0:
            return ("%s/%s logged no rewrite converting nodes (%d rewrite line(s)): mixed precision "
                    "did not run" % (self.name, self.mode, self.rewrites))
        return None


def command(entry: Program, mode: str, seed: int = 0, extra_args=()) -> list:
    """The command line that runs ``entry`` in ``mode``."""
    args = ["--seed", str(seed)] + list(extra_args)
    if mode == "tfamp_run":
        return [sys.executable] + _LAUNCHER + [entry.path] + args
    if mode in ("fp32", "zero_code"):
        return [sys.executable, entry.path] + args
    raise ValueError("mode must be one of %s, not %r" % (", ".join(MODES), mode))


def environment(mode: str, extra_env=None) -> dict:
    """The child's environment in ``mode`` (see the module docstring), plus ``extra_env``."""
    env = {name: value for name, value in os.environ.items() if name not in _AMP_VARIABLES}
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    if mode == "zero_code":
        env.update(TF_ENABLE_AUTO_MIXED_PRECISION="1", TFAMP_REWRITE_TARGET="cpu",
                   TFAMP_REWRITE_NUMERICS="emulate")
    env.update(extra_env or {})
    return env


def parse_run(name: str, mode: str, returncode: int, seconds: float, stdout: str, stderr: str) -> RunResult:
    """A ``RunResult`` from what the child printed."""
    result = RunResult(name, mode, returncode, seconds, stdout=stdout, stderr=stderr)
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    match = _FINAL_LOSS.match(lines[-1]) if lines else None
    if match:
        result.final_loss = float(match.group(1))
    for line in lines:
        point = _CURVE_POINT.match(line)
        if point:
            result.curve.append((int(point.group(1)), float(point.group(2))))
    for line in stderr.splitlines():
        rewrite = _REWRITE_LINE.search(line)
        if rewrite:
            result.rewrites += 1
            result.nodes_converted = max(result.nodes_converted, int(rewrite.group(1)))
            result.compat = rewrite.group(3).rstrip(";,")
        elif "tfamp" in line.lower():
            result.product_messages.append(line.strip())
            result.heals += line.startswith("tfamp_rewrite: healed:")
    return result


def start(entry: Program, mode: str, seed: int = 0, extra_args=(), extra_env=None):
    """Starts ``entry`` in ``mode`` (``extra_env`` added to its environment); ``finish`` collects it."""
    process = subprocess.Popen(command(entry, mode, seed, extra_args), cwd=REPO,
                               env=environment(mode, extra_env),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return entry, mode, process, time.time()


def finish(started) -> RunResult:
    entry, mode, process, began = started
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        stderr += "\n[program_corpus: killed after %d s]" % RUN_TIMEOUT_S
    return parse_run(entry.name, mode, process.returncode, time.time() - began, stdout, stderr)


def run_program(entry: Program, mode: str, seed: int = 0, extra_args=(), extra_env=None) -> RunResult:
    """Runs ``entry`` in ``mode`` (``fp32``, ``zero_code`` or ``tfamp_run``) and waits for it."""
    return finish(start(entry, mode, seed, extra_args, extra_env))


_BATCH_BEGIN = "program_corpus: begin "


def start_batch(names, mode: str, seed: int = 0, steps=None):
    """Starts ``run_batch`` of ``names`` in ``mode``; ``finish_batch`` collects it."""
    command_line = [sys.executable] + (_LAUNCHER if mode == "tfamp_run" else [])
    command_line += [os.path.abspath(__file__), "--batch", "--seed", str(seed)]
    command_line += ["--steps", str(steps)] if steps else []
    for name in names:
        command_line += ["--only", program(name).name]
    process = subprocess.Popen(command_line, cwd=REPO, env=environment(mode), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    return list(names), mode, process


def finish_batch(started) -> dict:
    """``{name: RunResult}`` of a batch; ``RuntimeError`` with its output if the batch itself
    failed (a program that fails only fails its own ``RunResult``)."""
    names, mode, process = started
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S * max(1, len(names)))
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    lines = stdout.strip().splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError("the %s batch of %s failed with status %s:\n%s" % (
            mode, ", ".join(names), process.returncode, stderr[-4000:]))
    runs = json.loads(lines[-1])
    # Each program's stderr is the part after its begin marker (the product's log lines included).
    segments = {}
    for part in stderr.split(_BATCH_BEGIN)[1:]:
        name, _, text = part.partition("\n")
        segments[name] = text
    results = {}
    for name in names:
        run = runs[name]
        result = parse_run(name, mode, run["returncode"], run["seconds"], run["stdout"],
                           segments.get(name, "") + run["error"])
        result.graph = run["graph"]
        results[name] = result
    return results


def run_batch(names, mode: str, seed: int = 0, steps=None) -> dict:
    """Runs the named programs one after the other in one new process in ``mode`` (``fp32`` or
    ``tfamp_run``; ``zero_code`` too) and returns ``{name: RunResult}``.  Each result's
    ``graph`` holds the op types, loss-scale variables and resource variables of the graphs
    of the sessions the program created; ``seconds`` is the program's own time, start-up
    excluded.  ``steps`` overrides the programs' own step counts."""
    return finish_batch(start_batch(names, mode, seed, steps))


BATCH_MODES = ("fp32", "tfamp_run")


def run_batches(names, seed: int = 0, concurrent: bool = True) -> dict:
    """``{mode: {name: RunResult}}`` of ``run_batch`` in each of BATCH_MODES, the two processes
    side by side unless ``concurrent`` is False."""
    if not concurrent:
        return {mode: run_batch(names, mode, seed) for mode in BATCH_MODES}
    started = [start_batch(names, mode, seed) for mode in BATCH_MODES]
    return {item[1]: finish_batch(item) for item in started}


def corpus_results(names, seed: int = 0, concurrent: bool = True):
    """Yields ``(name, {mode: RunResult})`` program by program: the batches first
    (``run_batches``), then zero-code AMP in one process per program."""
    batches = run_batches(names, seed, concurrent)
    for name in names:
        results = {mode: batches[mode][name] for mode in BATCH_MODES}
        results["zero_code"] = run_program(program(name), "zero_code", seed)
        yield name, results


def relative_difference(amp: float, fp32: float) -> float:
    """|amp - fp32| / max(|fp32|, LOSS_FLOOR); nan when either is nan."""
    return abs(amp - fp32) / max(abs(fp32), LOSS_FLOOR)


def comparison_problems(entry: Program, results: dict) -> list:
    """What is wrong with ``results`` (``{mode: RunResult}``) for ``entry``: each unfinished run, and
    each AMP final loss outside the tolerance (with both loss curves)."""
    problems = [result.problem() for result in results.values() if result.problem()]
    fp32 = results.get("fp32")
    if problems or fp32 is None:
        return problems
    for mode in AMP_MODES:
        if mode not in results:
            continue
        amp = results[mode]
        if entry.must_heal and not (amp.heals and any("training steps are being skipped" in m
                                                       for m in amp.product_messages)):
            problems.append("%s/%s: no skipped-step warning and heal in its log" % (entry.name, mode))
        difference = relative_difference(amp.final_loss, fp32.final_loss)
        if not difference <= entry.tolerance:
            problems.append("%s/%s final loss %r vs fp32 %r: relative difference %.4f > tolerance %.2f\n"
                            "  fp32 curve: %s\n  %s curve: %s" % (
                                entry.name, mode, amp.final_loss, fp32.final_loss, difference,
                                entry.tolerance, fp32.curve, mode, amp.curve))
    return problems


def describe_problems(results: dict) -> str:
    """The tails of the runs' output, for an assertion message."""
    return "\n".join("=== %s ===\n%s" % (mode, result.tail) for mode, result in results.items())


_HEADER = ("program", "fp32 loss", "AMP loss", "tfamp-run loss", "rel diff", "converted", "heals",
           "s fp32/AMP/run", "tolerance", "compat")


def table_row(entry: Program, results: dict) -> tuple:
    fp32, amp, launched = results["fp32"], results["zero_code"], results["tfamp_run"]
    difference = max(relative_difference(amp.final_loss, fp32.final_loss),
                     relative_difference(launched.final_loss, fp32.final_loss))
    converted = "%d/%d" % (amp.nodes_converted, launched.nodes_converted)
    heals = "%d/%d" % (amp.heals, launched.heals)
    seconds = "%.1f/%.1f/%.1f" % (fp32.seconds, amp.seconds, launched.seconds)
    verdict = "" if not comparison_problems(entry, results) else " FAIL"
    return (entry.name, "%.6g" % fp32.final_loss, "%.6g" % amp.final_loss, "%.6g" % launched.final_loss,
            "%.4f%s" % (difference, verdict), converted, heals, seconds, "%.2f" % entry.tolerance,
            amp.compat)


def format_table(rows, header: bool = True) -> str:
    """``rows`` (``table_row``'s) as aligned text; the widths fit the whole corpus, so rows
    printed one by one line up."""
    widths = [max(len(entry.name) for entry in CORPUS)] + [len(title) for title in _HEADER[1:]]
    widths[5:7] = [max(widths[5], 9), max(widths[6], 16)]
    rows = ([_HEADER] if header else []) + list(rows)
    widths = [max([width] + [len(row[column]) for row in rows]) for column, width in enumerate(widths)]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)


def measure_spread(entry: Program, seeds=range(5)) -> tuple:
    """(fp32 final losses by seed, max relative difference of seeds 1.. from the first)."""
    losses = []
    for seed in seeds:
        result = run_batch([entry.name], "fp32", seed)[entry.name]
        if result.problem():
            raise RuntimeError(result.problem() + "\n" + result.tail)
        losses.append(result.final_loss)
    spread = max(relative_difference(loss, losses[0]) for loss in losses[1:])
    return losses, spread


def _run_here(names, seed: int, steps) -> dict:
    """Runs each named program in this process, as ``__main__`` in a graph of its own with
    ``--seed seed`` (and ``--steps steps``), and returns ``{name: {"returncode", "seconds",
    "stdout", "error", "graph": {"op_types", "loss_scale_variables", "resource_variables"}}}``
    over the graphs of the sessions it created.  Called in a child process (``--batch``): the
    programs disable v2 behaviour themselves.  Before each program, stderr gets a begin marker
    line, so that the parent can give each its own log lines."""
    import contextlib
    import io
    import runpy
    import traceback

    import tensorflow as tf
    from tensorflow.python.client import session as session_lib

    graphs = []
    original_init = session_lib.BaseSession.__init__

    def recording_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        graphs.append(self.graph)

    session_lib.BaseSession.__init__ = recording_init
    runs = {}
    for name in names:
        entry = program(name)
        del graphs[:]
        sys.stderr.write(_BATCH_BEGIN + name + "\n")
        sys.stderr.flush()
        saved_argv, stdout, error, returncode = sys.argv, io.StringIO(), "", 0
        sys.argv = [entry.path, "--seed", str(seed)] + (["--steps", str(steps)] if steps else [])
        began = time.time()
        try:
            with tf.Graph().as_default(), contextlib.redirect_stdout(stdout):
                runpy.run_path(entry.path, run_name="__main__")
        except SystemExit as stop:
            returncode = 0 if stop.code in (None, 0) else 1
        except Exception:  # noqa: BLE001 -- the program's failure is its result, not the batch's
            error, returncode = traceback.format_exc(), 1
        finally:
            sys.argv = saved_argv
        operations = [op for graph in {id(graph): graph for graph in graphs}.values()
                      for op in graph.get_operations()]
        runs[name] = {
            "returncode": returncode, "seconds": time.time() - began, "stdout": stdout.getvalue(),
            "error": error,
            "graph": {
                "op_types": sorted({op.type for op in operations}),
                "loss_scale_variables": sorted({op.name for op in operations if "loss_scale" in op.name
                                                and op.type in ("VariableV2", "VarHandleOp")}),
                "resource_variables": sorted({op.name for op in operations if op.type == "VarHandleOp"}),
            },
        }
    sys.stderr.flush()
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run the TF1 program corpus in fp32 and in mixed precision.")
    parser.add_argument("--only", action="append", help="run only this program (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequential", action="store_true",
                        help="one process at a time, so that the seconds are each run's own")
    parser.add_argument("--spread", action="store_true",
                        help="measure the fp32 final loss over seeds 0..4 instead "
                             "(what the tolerances rest on)")
    parser.add_argument("--batch", action="store_true",
                        help="run the programs in this process and print, as JSON, what each did "
                             "(run_batch's child)")
    parser.add_argument("--steps", type=int, help="with --batch: instead of each program's own step count")
    args = parser.parse_args(argv)
    entries = [program(name) for name in args.only] if args.only else list(CORPUS)
    names = [entry.name for entry in entries if not unavailable_reason(entry)]
    if args.batch:
        runs = _run_here(names, args.seed, args.steps)
        print(json.dumps(runs))
        return 0
    for entry in entries:
        if entry.name not in names:
            print("%s: skipped: %s" % (entry.name, unavailable_reason(entry)), flush=True)
    if args.spread:
        for entry in (program(name) for name in names):
            losses, spread = measure_spread(entry)
            print("%s: fp32 final loss by seed %s; spread %.4f; tolerance %.2f" % (
                entry.name, ", ".join("%.4g" % loss for loss in losses), spread, entry.tolerance), flush=True)
        return 0
    rows, failures = [], []
    print(format_table([]), flush=True)
    for name, results in corpus_results(names, args.seed, concurrent=not args.sequential):
        entry = program(name)
        rows.append(table_row(entry, results))
        print(format_table(rows[-1:], header=False), flush=True)
        problems = comparison_problems(entry, results)
        messages = sorted({line for result in results.values() for line in result.product_messages})
        for line in messages:
            print("  %s: %s" % (entry.name, line), flush=True)
        if problems:
            failures.append(entry.name)
            print("\n".join(problems) + "\n" + describe_problems(results), flush=True)
    if rows:
        print("\n" + format_table(rows))
        print("seconds: zero-code AMP's are its process's wall time; fp32's and tfamp-run's are the "
              "program's own in its batch (start-up excluded)")
    if failures:
        print("failed: %s" % ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
