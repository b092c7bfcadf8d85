"""Interpreter start-up hook of tfamp_rewrite, run by ``tfamp_rewrite_startup.pth``.

When one of NVIDIA's ``TF_ENABLE_AUTO_MIXED_PRECISION*`` variables is set, it arranges for
``tfamp_rewrite.training.activation.activate_from_environment()`` to run right after TensorFlow is
imported, so an unmodified ``python train.py`` trains in mixed precision.  Otherwise it
costs nothing: it imports neither TensorFlow nor tfamp_rewrite.
"""
import os
import sys

VARIABLES = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
             "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING")


def _activate():
    from tfamp_rewrite.training import activation

    activation.activate_from_environment()


class _ActivateAfterTensorFlowImport:
    """A meta-path finder that hooks the loading of the ``tensorflow`` package once."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                _activate()

            spec.loader.exec_module = exec_module
        return spec


def install():
    """Activates now if TensorFlow is loaded, else when it is; no-op without the variables."""
    if not any(os.environ.get(name, "").strip() for name in VARIABLES):
        return
    if "tensorflow" in sys.modules:
        _activate()
    elif not any(isinstance(f, _ActivateAfterTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ActivateAfterTensorFlowImport())


install()
