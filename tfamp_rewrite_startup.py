"""Interpreter start-up hook of tfamp_rewrite, run by ``tfamp_rewrite_startup.pth``.

When one of NVIDIA's ``TF_ENABLE_AUTO_MIXED_PRECISION*`` variables is set, it arranges for
``tfamp_rewrite.training.activation.activate_from_environment()`` to run right after TensorFlow is
imported, so an unmodified ``python train.py`` trains in mixed precision.  Otherwise it
costs nothing: it imports neither TensorFlow nor tfamp_rewrite.

``activate_when_tensorflow_loads()`` is the same arrangement on demand (``tfamp-run`` uses it
after setting the variables).  Activation runs once TensorFlow's own ``__init__`` has finished,
whatever imported it -- the user's script, or a module of tfamp_rewrite that is itself still
being imported: ``activation`` is built so that this is safe (see its docstring).  A failure
(a variable that is not a boolean) is one line on stderr; ``import tensorflow`` still succeeds.
"""
import os
import sys

VARIABLES = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
             "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING")


def _activate():
    try:
        from tfamp_rewrite.training import activation

        activation.activate_from_environment()
    except Exception as error:  # never break the user's ``import tensorflow``
        sys.stderr.write("tfamp_rewrite: mixed precision is not activated: %s\n" % error)


class _ActivateAfterTensorFlowImport:
    """A meta-path finder that hooks the loading of the ``tensorflow`` package once."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        import importlib.util

        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                _activate()

            spec.loader.exec_module = exec_module
        return spec


def activate_when_tensorflow_loads():
    """Activates from the environment now if TensorFlow is loaded, else right after it is."""
    if "tensorflow" in sys.modules:
        _activate()
    elif not any(isinstance(finder, _ActivateAfterTensorFlowImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ActivateAfterTensorFlowImport())


def install():
    """Activates when TensorFlow loads if a variable is set; no-op without them."""
    if any(os.environ.get(name, "").strip() for name in VARIABLES):
        activate_when_tensorflow_loads()


install()
