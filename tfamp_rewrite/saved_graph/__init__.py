"""Saved graphs on disk: convert a frozen GraphDef, a MetaGraph or a SavedModel, and explain it.

Entry point: ``cli.main(argv)`` (the ``tfamp-rewrite`` command and ``python -m
tfamp_rewrite``).  ``formats`` reads the three formats, ``input_check`` refuses invalid
ones (``op_def_check`` / ``attr_check``: nodes against OpDefs; ``import_check``: TensorFlow's
importer; ``checkpoint_check``: a SavedModel's variables), ``graph_io`` resolves inputs and
outputs, ``conversion`` runs the pass with ``keep_io_types``, exclusions and constant
folding (``constants``), ``writer`` writes atomically, ``validate`` compares the original
and converted graphs on the same inputs, ``explain`` / ``dot`` turn the report into reason
chains and pictures, and ``report_schema`` is the JSON schema of ``--report``.
``calibration`` and ``auto_tune`` choose by data what stays float32 (``tuning`` runs them
around ``conversion``), and ``doctor_command`` is ``tfamp-rewrite doctor``: it starts the
training doctor in a child process.

May import: the shared basics, ``graph_rewrite``, ``doctor`` and ``fused_op`` (whose
``RoundToHalf`` op validation's emulated graphs round with).  Not ``training``.
"""
