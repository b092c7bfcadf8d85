"""The process-wide switches: sessions that rewrite, optimizers that scale their loss.

* Graph rewrite: while on, constructing TensorFlow's ``Session`` or ``InteractiveSession``
  -- directly, or through ``MonitoredTrainingSession``, ``Estimator`` or Keras' backend --
  yields ``tfamp_rewrite``'s subclass.  The classes' ``__new__`` does it, so no name in
  TensorFlow changes (TensorFlow's own ``super(Session, self)`` calls keep working) and
  ``isinstance(sess, tf.compat.v1.Session)`` still holds.  Only sessions created while it
  is on rewrite (as TensorFlow's ``BaseSession`` reads its flag at construction).
* The precision doctor (``set_doctor``): while set, the same constructors yield
  ``doctor_session``'s sessions, which run the float32 graph and measure what the
  rewrite would hold in half (``tfamp-rewrite doctor``).
* Automatic loss scaling: while on, every ``tf.compat.v1.train.Optimizer`` scales its loss
  and skips non-finite steps by itself, through a ``LossScaleOptimizer`` it creates around
  itself on first use -- NVIDIA's TF 1.15 behaviour under
  ``TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING``.  An optimizer the user wrapped
  explicitly is scaled once, by that wrapper; an optimizer that already scales its loss
  natively (NVIDIA's builds) is left to do so.

* NaN-loss hooks: while either is on, ``NanTensorHook`` (every Estimator adds one) lets a
  NaN loss pass, saying so once, when the same run's loss-scaled step was skipped and the
  session's step watch is still working on it (step_watch.py): no weight was updated, and a
  float16 forward overflow is healed a few steps later.  Once the watch can do no more, the
  hook stops training as TensorFlow's does.  ``StopAtStepHook`` (what ``Estimator.train``'s
  ``steps`` and ``max_steps`` add) ends training, saying so once, where every step has
  skipped for good for ``step_watch.FROZEN_AFTER`` runs in a row: global_step counts
  applied steps only, so it would never reach the last step.
* TensorFlow's own ``MixedPrecisionLossScaleOptimizer`` (what
  ``tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite`` returns, as
  NVIDIA's docs told TF1 users to call): while either is on, the optimizer it wraps is not
  scaled again -- the loss is scaled once, by TensorFlow's, whose skipped steps the session
  does not watch; said once.
* ``tf.add_check_numerics_ops``: while either is on, it leaves out the ops of the loss
  scaling's skip cond, which TensorFlow's version refuses under TF1 control flow.
* Warm starts: while either is on, ``tf.compat.v1.train.warm_start`` (and an Estimator's
  ``WarmStartSettings``) given a list of patterns, which match every global variable,
  leaves the loss scale's variables out, and says so once: mixed precision added them,
  so a float32 checkpoint has none, and TensorFlow would refuse the whole warm start.
* ``freeze_graph``: while either is on, a freeze from a graph file and a checkpoint that
  fails on the loss scale's resource variables (which it cannot map from a graph file)
  raises a one-line error naming the fix, ``input_meta_graph=`` or
  ``convert_variables_to_constants``.

``activate_from_environment()`` reads NVIDIA's variables (``TF_ENABLE_AUTO_MIXED_PRECISION``
and its ``_GRAPH_REWRITE`` / ``_LOSS_SCALING`` refinements); ``deactivate()`` turns both
off (the optimizer methods are TensorFlow's own again; the session classes keep an inert
``__new__``).  This module is the only one that patches TensorFlow.

Import order: this module imports nothing at load time that imports TensorFlow, and
switching on imports only TensorFlow (never another module of this package: the session
classes and ``LossScaleOptimizer`` are looked up when a session is constructed or an
optimizer first computes gradients).  So the start-up hook, which switches on right after
TensorFlow's own import finishes, may run whatever of this package is half-imported at
that moment -- ``import tfamp_rewrite`` before or after ``import tensorflow``, ``tfamp-run``,
``enable_mixed_precision_graph_rewrite`` all reach the same state.  Every function here is
idempotent and may be re-entered (the hook can fire inside ``enable_*`` when that is what
first imports TensorFlow).
"""
from __future__ import annotations

import functools
import importlib
import os
import threading
from typing import Dict, Mapping

ENABLE_ENV = "TF_ENABLE_AUTO_MIXED_PRECISION"
GRAPH_REWRITE_ENV = "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE"
LOSS_SCALING_ENV = "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING"

# What an automatically loss-scaled optimizer answers through its LossScaleOptimizer: its
# gradients and updates, and its variables() (which then include the loss scale's, so
# ``variables_initializer(opt.variables())`` and Keras' initialisation cover them).
_DELEGATED_METHODS = ("compute_gradients", "apply_gradients", "variables")
_AUTO_SCALER = "_tfamp_auto_loss_scaler"
_NEW_MARKER = "_tfamp_rewriting_new"
_WARM_START_GROUPS = "_get_grouped_variables"  # warm_starting_util's: what a warm start covers

# Held only while patching, never while importing: a thread importing TensorFlow runs the
# start-up hook with TensorFlow's import lock held, so waiting on it here could deadlock.
_lock = threading.RLock()
_original_methods: Dict[str, object] = {}  # TensorFlow's Optimizer methods, captured once
_graph_rewrite = False
_loss_scaling = False
_doctor = None  # the precision doctor's run, while sessions probe instead of rewriting
# (owner, attribute) -> TensorFlow's value, for each attribute ours replaces while on.
_replaced: Dict[tuple, object] = {}


def _tensorflow_v1():
    """``tf.compat.v1``; importing TensorFlow here may run the start-up hook (re-entry is fine)."""
    import tensorflow as tf

    return tf.compat.v1


# -- graph rewrite ------------------------------------------------------------------------
def graph_rewrite_enabled() -> bool:
    """True while sessions created from now on run the mixed-precision rewrite."""
    return _graph_rewrite


def enable_graph_rewrite() -> None:
    """New TensorFlow sessions are ``tfamp_rewrite``'s (idempotent)."""
    global _graph_rewrite
    tf1 = _tensorflow_v1()
    with _lock:
        for original in (tf1.Session, tf1.InteractiveSession):
            if not _is_ours(original.__dict__.get("__new__")):
                original.__new__ = _constructing(original)
        _replace_helpers()
        _graph_rewrite = True


def disable_graph_rewrite() -> None:
    """New sessions are TensorFlow's again; sessions already created are unaffected."""
    global _graph_rewrite
    _graph_rewrite = False


def _constructing(original):
    """A ``__new__`` for ``original`` that builds ``tfamp_rewrite``'s subclass of it while on.

    Once installed it stays (switched by the flag): CPython cannot take an assigned
    ``__new__`` back, the slot left behind rejects constructor arguments.  The subclass is
    looked up at construction, when every import has long finished.
    """
    def __new__(cls, *args, **kwargs):
        doctor = None
        if cls is original and _doctor is not None:
            from . import doctor_session

            cls, doctor = getattr(doctor_session, original.__name__), _doctor
        elif cls is original and _graph_rewrite:
            from . import session

            cls = getattr(session, original.__name__)
        instance = object.__new__(cls)
        if doctor is not None:
            instance.doctor_run = doctor  # what the probing session reports to
        return instance

    setattr(__new__, _NEW_MARKER, True)
    return staticmethod(__new__)


def _is_ours(new) -> bool:
    return getattr(getattr(new, "__func__", None), _NEW_MARKER, False)


# -- the precision doctor ------------------------------------------------------------------
def set_doctor(run) -> None:
    """Sessions constructed while ``run`` is set probe for it (``doctor_session``); None ends it.

    It takes precedence over the graph rewrite and imports nothing: sessions switch once
    the graph-rewrite switch has installed its ``__new__`` (``activate_from_environment``).
    """
    global _doctor
    _doctor = run


def doctor_run():
    """The precision doctor's run that new sessions probe for, or None."""
    return _doctor


# -- automatic loss scaling ---------------------------------------------------------------
def loss_scaling_enabled() -> bool:
    """True while every tf.compat.v1.train.Optimizer applies dynamic loss scaling itself."""
    return _loss_scaling


def enable_loss_scaling() -> None:
    """Every ``tf.compat.v1.train.Optimizer`` scales its loss from now on (idempotent)."""
    global _loss_scaling
    optimizer = _tensorflow_v1().train.Optimizer
    with _lock:
        if not _original_methods:
            _original_methods.update({name: optimizer.__dict__[name] for name in _DELEGATED_METHODS})
        for name, method in _original_methods.items():
            if optimizer.__dict__[name] is method:
                setattr(optimizer, name, _with_auto_loss_scaling(name, method))
        _replace_helpers()
        _loss_scaling = True


def disable_loss_scaling() -> None:
    """Optimizers stop scaling their loss in graphs built from now on."""
    global _loss_scaling
    with _lock:
        if _original_methods:
            optimizer = _tensorflow_v1().train.Optimizer
            for name, method in _original_methods.items():
                setattr(optimizer, name, method)
        _loss_scaling = False


def _with_auto_loss_scaling(name, method):
    @functools.wraps(method)
    def scaled(self, *args, **kwargs):
        loss = (args[0] if args else kwargs.get("loss")) if name == "compute_gradients" else None
        scaler = _auto_scaler(self, loss)
        if scaler is None:
            return method(self, *args, **kwargs)
        return getattr(scaler, name)(*args, **kwargs)

    return scaled


def _auto_scaler(opt, loss=None):
    """The LossScaleOptimizer ``opt`` delegates to, or None if ``opt`` must act itself;
    made on first use, given the ``loss`` of a first ``compute_gradients``.  A loss the
    program scales itself (own_loss_scale.py) is not scaled again: the scale starts and
    stays at 1, and steps whose gradients hold inf/nan are still skipped and healed."""
    from . import loss_scale_optimizer
    from .loss_scale import DynamicLossScale, automatic_initial_loss_scale
    from .own_loss_scale import own_scale

    if loss_scale_optimizer.delegating():  # a wrapper is calling the optimizer it wraps
        return None
    state = opt.__dict__
    if state.get("_loss_scale") is not None:  # NVIDIA's builds: scales natively
        return None
    scaler = state.get(_AUTO_SCALER)
    if scaler is None:
        programs = own_scale(loss) if isinstance(loss, _tensorflow_v1().Tensor) else None
        automatic = DynamicLossScale(automatic_initial_loss_scale())
        # never grows: the program's own scale does, or stays as it chose
        scale = automatic if programs is None else DynamicLossScale(1, increment_period=2 ** 31 - 1)
        scaler = state[_AUTO_SCALER] = loss_scale_optimizer.LossScaleOptimizer(opt, scale)
        scaler._state_owner = opt  # the user checkpoints opt: the loss scale is saved with it
        # A subclass whose compute_gradients or apply_gradients calls super() reaches the
        # scaler from inside its override: the scaler calls the base class's, not the override.
        scaler._inner_methods = {name: functools.partial(_original_methods[name], opt)
                                 for name in _DELEGATED_METHODS}
        _route_own_apply_through(opt, scaler)
        _say_loss_scaling_is_on(opt, automatic)
        if programs is not None:
            _say_scaled_by_the_program(opt, loss, programs)
    return scaler


def _route_own_apply_through(opt, scaler) -> None:
    """For a subclass whose own ``apply_gradients`` assigns the new values and never calls
    an ``apply_gradients`` (SimCLR's LARS, BERT's AdamWeightDecay), called by ``minimize``:
    the base ``compute_gradients`` scales its loss, so the override would apply overflowed
    gradients unchecked.  ``opt.apply_gradients`` then hands gradients computed through
    the scaler to the scaler's, which runs the override inside its skip branch; others
    (``tf.gradients`` of the unscaled loss, as BERT's script computes them) go to the
    override as before (unscaled_training.py says so)."""
    own = type(opt).apply_gradients
    code = getattr(own, "__code__", None)
    if own is _tensorflow_v1().train.Optimizer.apply_gradients or code is None or \
            "apply_gradients" in code.co_names:  # the base's, or an override reaching it
        return
    scaler._inner_methods["apply_gradients"] = functools.partial(own, opt)

    @functools.wraps(own)
    def apply_gradients(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if scaler.scaled([g for g, _ in grads_and_vars]):
            return scaler.apply_gradients(grads_and_vars, *args, **kwargs)
        return own(opt, grads_and_vars, *args, **kwargs)

    opt.__dict__["apply_gradients"] = apply_gradients


def _say_scaled_by_the_program(opt, loss, factor: str) -> None:
    """Says once per optimizer that its loss was scaled already, so is not scaled again."""
    from .devices import log_once

    log_once("tfamp_rewrite: the loss %r given to '%s' (%s) is multiplied by %s already, the "
             "program's own loss scaling: automatic loss scaling leaves that optimizer's scale "
             "at 1, so the two do not multiply, and still skips a step whose gradients hold "
             "inf/nan (said once)" % (loss.op.name, opt.get_name(), type(opt).__name__, factor))


def _say_loss_scaling_is_on(opt, scale) -> None:
    """Says once per process that optimizers scale their loss: the first skipped step may come
    late or never, and a user must know before then that the gradients are scaled."""
    from .devices import log_once

    log_once("tfamp_rewrite: automatic loss scaling is on: %s and every other "
             "tf.compat.v1.train.Optimizer multiply the loss they differentiate (minimize, "
             "compute_gradients) by a dynamic scale (from %g, doubled after %d finite steps in a "
             "row) and divide the gradients by it before applying them; gradients computed or fed "
             "otherwise are applied as given. A step whose gradients hold inf/nan is skipped (no "
             "variable is updated) and the scale halved. Each scale is a variable (loss_scale/"
             "current_loss_scale, the next optimizer's loss_scale_1/...) and a scalar summary "
             "that merge_all picks up ('current_loss_scale', then 'current_loss_scale_1', ... in "
             "the order the optimizers are built)"
             % ("'%s' (%s)" % (opt.get_name(), type(opt).__name__),
                scale.initial_loss_scale, scale.increment_period),
             key="automatic loss scaling is on")  # the line names the first optimizer only


# -- warm starts and NaN-loss hooks -------------------------------------------------------
def _replace_helpers() -> None:
    """Replaces, once, the TensorFlow helpers the module docstring lists: warm_starting_util's
    variable grouping, ``NanTensorHook``'s and ``StopAtStepHook``'s ``before_run`` and ``after_run``,
    ``MixedPrecisionLossScaleOptimizer``'s ``compute_gradients`` and ``apply_gradients``, and
    ``add_check_numerics_ops`` wherever TensorFlow exports it.  ``warm_start`` --
    ``tf.compat.v1.train.warm_start`` and the Estimator's -- looks the grouping up at each
    call, so no TensorFlow name changes.  Called with ``_lock`` held."""
    from tensorflow.python.training import warm_starting_util

    _replace(warm_starting_util, _WARM_START_GROUPS, _without_loss_scales)
    nan_hook = _tensorflow_v1().train.NanTensorHook
    _replace(nan_hook, "before_run", _counting_step_runs)
    _replace(nan_hook, "after_run", _waiting_for_skipped_steps)
    stop_hook = _tensorflow_v1().train.StopAtStepHook
    _replace(stop_hook, "before_run", _counting_step_runs)
    _replace(stop_hook, "after_run", _stopping_when_frozen)
    tensorflows_scaler = importlib.import_module(
        "tensorflow.python.training.experimental.loss_scale_optimizer").MixedPrecisionLossScaleOptimizer
    for name in ("compute_gradients", "apply_gradients"):
        _replace(tensorflows_scaler, name, _scaling_once)
    numerics = importlib.import_module("tensorflow.python.ops.numerics")
    for owner in (numerics, _tensorflow_v1(), importlib.import_module("tensorflow")):
        _replace(owner, "add_check_numerics_ops", _outside_the_skip_cond)
    freeze_graph = importlib.import_module("tensorflow.python.tools.freeze_graph")
    _replace(freeze_graph, "freeze_graph_with_def_protos", _explaining_loss_scale_variables)


_META_GRAPH_ARGUMENT = 11  # freeze_graph_with_def_protos' input_meta_graph_def, in 1.15 and 2.x


def _explaining_loss_scale_variables(original):
    """``freeze_graph_with_def_protos`` as TensorFlow's; where it fails on a graph file holding
    the loss scale's resource variables (its Saver is given their handles), a one-line
    ValueError names the problem and the fix."""
    @functools.wraps(original)
    def freeze_graph_with_def_protos(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except (IndexError, TypeError, ValueError) as error:
            graph_def = kwargs.get("input_graph_def", args[0] if args else None)
            meta_graph = kwargs.get("input_meta_graph_def",
                                    args[_META_GRAPH_ARGUMENT] if len(args) > _META_GRAPH_ARGUMENT else None)
            held = sorted(node.name for node in getattr(graph_def, "node", ())
                          if node.op == "VarHandleOp" and node.name.split("/")[-1] in _LOSS_SCALE_STATE
                          and node.name.split("/")[-2].startswith("loss_scale"))
            if meta_graph is not None or not held:
                raise
            raise ValueError(
                "freeze_graph cannot map the loss scale's resource variables (%s) of this graph "
                "file to the checkpoint (%s): give it input_meta_graph= (the checkpoint's .meta), "
                "or freeze from the session with tf.compat.v1.graph_util.convert_variables_to_constants"
                % (", ".join(repr(name) for name in held), type(error).__name__)) from error
    return freeze_graph_with_def_protos


_LOSS_SCALE_STATE = ("current_loss_scale", "good_steps")


def _replace(owner, name: str, wrap) -> None:
    """Sets ``owner.name`` to ``wrap(its value)``, keeping TensorFlow's for ``_restore_helpers``;
    nothing if ``owner`` has no such attribute of its own or it is replaced already."""
    original = owner.__dict__.get(name)
    if original is None or (owner, name) in _replaced:
        return
    _replaced[(owner, name)] = original
    setattr(owner, name, wrap(original))


def _restore_helpers() -> None:
    """Puts TensorFlow's values back.  Called with ``_lock`` held."""
    for (owner, name), original in _replaced.items():
        setattr(owner, name, original)
    _replaced.clear()


def _without_loss_scales(original):
    @functools.wraps(original)
    def grouped_variables(vars_to_warm_start):
        groups = original(vars_to_warm_start)
        patterns = isinstance(vars_to_warm_start, list) and all(
            isinstance(v, str) for v in vars_to_warm_start)
        if not patterns:  # a string (trainable variables only), None, or variables named by the user
            return groups
        from . import step_signals
        from .devices import log_once

        graph = _tensorflow_v1().get_default_graph()
        ours = {v.op.name for v in step_signals.loss_scale_variables(step_signals.step_signals(graph))}
        left_out = sorted(name for name in groups if name in ours)
        if left_out:
            log_once("tfamp_rewrite: the warm start leaves the loss scale's variables out (%s): mixed "
                     "precision added them, so they start from their initial values"
                     % ", ".join(left_out))
        return {name: group for name, group in groups.items() if name not in ours}

    return grouped_variables


def _outside_the_skip_cond(original):
    """``add_check_numerics_ops`` as TensorFlow's, but for the ops of the loss scaling's skip
    cond, which TensorFlow's refuses (it cannot check inside a TF1 cond) and which run only
    in applied steps; what it leaves out is said once."""
    @functools.wraps(original)
    def add_check_numerics_ops():
        import tensorflow as tf

        from .step_signals import in_skip_cond

        graph = tf.compat.v1.get_default_graph()
        skipped = [op for op in graph.get_operations() if in_skip_cond(op)]
        if not skipped or tf.executing_eagerly():
            return original()
        from .devices import log_once

        log_once("tfamp_rewrite: tf.add_check_numerics_ops() leaves out the %d op(s) of the loss "
                 "scaling's skip cond (e.g. '%s'), which TensorFlow's version refuses; the "
                 "gradients they apply are checked before it" % (len(skipped), skipped[0].name))
        skipped = set(skipped)
        checks = []
        for op in graph.get_operations():  # producers before consumers, as TensorFlow's relies on
            if op in skipped:
                continue
            for output in op.outputs:
                if output.dtype not in (tf.float16, tf.float32, tf.float64):
                    continue
                if op._get_control_flow_context() is not None:  # pylint: disable=protected-access
                    raise ValueError("`tf.add_check_numerics_ops() is not compatible with TensorFlow "
                                     "control flow operations such as `tf.cond()` or `tf.while_loop()`.")
                with tf.control_dependencies(checks):
                    checks = [tf.debugging.check_numerics(
                        output, message="%s:%d" % (op.name, output.value_index))]
        return tf.group(*checks)

    return add_check_numerics_ops


def _scaling_once(original):
    """TensorFlow's MixedPrecisionLossScaleOptimizer calls the optimizer it wraps as a
    LossScaleOptimizer does: that optimizer must not scale its loss again."""
    @functools.wraps(original)
    def delegating(self, *args, **kwargs):
        from . import loss_scale_optimizer
        from .devices import log_once

        if _loss_scaling:
            log_once("tfamp_rewrite: TensorFlow's MixedPrecisionLossScaleOptimizer (built by the "
                     "program, or by tf.compat.v1.train.experimental.enable_mixed_precision_graph_"
                     "rewrite) scales the loss of the optimizer it wraps, so automatic loss scaling "
                     "leaves that optimizer alone; its skipped steps are TensorFlow's, which the "
                     "session does not watch -- tfamp_rewrite.enable_mixed_precision_graph_rewrite"
                     "(opt) wraps with loss scaling it watches")
        with loss_scale_optimizer.delegation():
            return original(self, *args, **kwargs)

    return delegating


def _counting_step_runs(original):
    """A hook's before_run (NanTensorHook's, StopAtStepHook's) notes how many loss-scaled steps
    this thread ran so far, so its after_run asks about the step of the run it watched, not
    another hook's run since."""
    @functools.wraps(original)
    def before_run(self, run_context):
        from . import step_watch

        self._tfamp_step_runs = step_watch.step_runs_so_far()
        return original(self, run_context)

    return before_run


def _waiting_for_skipped_steps(original):
    @functools.wraps(original)
    def after_run(self, run_context, run_values):
        import numpy as np

        from . import step_watch
        from .devices import log_once

        graph = getattr(self._loss_tensor, "graph", None)
        if step_watch.skipped_while_recovering_since(graph, getattr(self, "_tfamp_step_runs", 0)):
            if np.isnan(run_values.results):
                log_once("tfamp_rewrite: NanTensorHook: the loss was NaN in a step the session is "
                         "still acting on (one the loss scaling skipped, so its optimizer applied no "
                         "update, or one whose inf/nan it is tracing); training goes on while the "
                         "session finds the cause (a float16 overflow is named and healed within a "
                         "few steps), and the hook stops it as usual if the session cannot")
            return None
        if step_watch.skipped_for_good_since(getattr(self, "_tfamp_step_runs", 0)):
            if np.isinf(run_values.results):
                # float32 would apply the inf gradients, its weights and loss NaN a step later:
                # the hook stops training as it would then, where every step skips for good
                # and global_step never moves (a StopAtStepHook, train(steps=N), waits for ever)
                log_once("tfamp_rewrite: NanTensorHook: the loss was inf in a skipped step the "
                         "session can do nothing more about, so every step skips and global_step "
                         "never moves; float32 would have updated the weights with it and its NaN "
                         "loss would stop training one step later, so the hook stops it now")
                return original(self, run_context, run_values._replace(results=np.float32("nan")))
        if step_watch.float32s_own_since(getattr(self, "_tfamp_step_runs", 0)):
            # a NaN gradient of float32's own (pow(0, 0.8)'s) with a finite loss: float32
            # applies it, and its NaN loss stops training a step later
            log_once("tfamp_rewrite: NanTensorHook: the step skipped for good on inf/nan that "
                     "float32 computes itself (said above); float32 would have updated the weights "
                     "with it and its NaN loss would stop training one step later, so the hook "
                     "stops it now")
            return original(self, run_context, run_values._replace(results=np.float32("nan")))
        return original(self, run_context, run_values)

    return after_run


def _stopping_when_frozen(original):
    @functools.wraps(original)
    def after_run(self, run_context, run_values):
        from . import step_watch
        from .devices import log_once

        original(self, run_context, run_values)
        if not run_context.stop_requested and step_watch.frozen_since(getattr(self, "_tfamp_step_runs", 0)):
            # global_step counts applied steps: where every step skips for good it never
            # reaches the last step, and the loop would run for ever
            log_once("tfamp_rewrite: StopAtStepHook: training stops at global_step %s, short of "
                     "its last step %s: every step skips for good (the lines above say why), so "
                     "global_step would never get there" % (run_values.results, self._last_step))
            run_context.request_stop()

    return after_run


# -- environment --------------------------------------------------------------------------
def _env_bool(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in ("1", "true"):
        return True
    if value in ("", "0", "false"):
        return False
    raise ValueError("%s=%r is not a boolean; use 1/true or 0/false" % (name, environ[name]))


def graph_rewrite_requested(environ: Mapping[str, str] = None) -> bool:
    """NVIDIA's rule: a non-empty ``..._GRAPH_REWRITE`` decides, else ``TF_ENABLE_AUTO_MIXED_PRECISION``."""
    environ = os.environ if environ is None else environ
    if environ.get(GRAPH_REWRITE_ENV, "").strip():
        return _env_bool(environ, GRAPH_REWRITE_ENV)
    return _env_bool(environ, ENABLE_ENV)


def loss_scaling_requested(environ: Mapping[str, str] = None) -> bool:
    """NVIDIA's rule: if ``..._LOSS_SCALING`` is set, it is on iff it is ``"1"``; else the main switch."""
    environ = os.environ if environ is None else environ
    if LOSS_SCALING_ENV in environ:
        return environ[LOSS_SCALING_ENV].strip() == "1"
    return environ.get(ENABLE_ENV, "").strip() == "1"


def activate_from_environment(environ: Mapping[str, str] = None) -> None:
    """Turns each switch on that NVIDIA's environment variables ask for (idempotent).

    Raises ValueError, before switching anything, for a variable that is not a boolean.
    """
    rewrite, scaling = graph_rewrite_requested(environ), loss_scaling_requested(environ)
    if rewrite:
        enable_graph_rewrite()
    if scaling:
        enable_loss_scaling()


def deactivate() -> None:
    """Turns both switches (and the doctor) off, restoring TensorFlow exactly."""
    set_doctor(None)
    disable_graph_rewrite()
    disable_loss_scaling()
    with _lock:
        _restore_helpers()
