"""What the example training scripts share: flags, AMP/XLA switches, the run loop, logging.

The scripts in ``examples/resnet50`` and ``examples/transformer`` put ``examples/`` on
``sys.path`` and import this package; each script only describes its model (a ``Task``,
see ``runtime.runner``).
"""
