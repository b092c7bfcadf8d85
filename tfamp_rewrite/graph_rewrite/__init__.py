"""The pure pass: a GraphDef in, a mixed-precision GraphDef and a report of every decision out.

Entry point: ``rewrite.rewrite_graph_def(graph_def, fetches=..., dtype=..., target=...)``.
It paints (node, type attribute) vertices with the allow / infer / deny / clear lists as
TensorFlow's Grappler ``auto_mixed_precision`` pass does (``op_lists``, ``graph_view``,
``eligibility``, ``painter``, ``data_structures``), changes type attributes and inserts
shared Casts (``casts``), rewrites reachable function bodies (``functions``) and explains
itself (``decisions``, ``report``, ``tensor_cores``).  ``numerics="emulate"`` runs half nodes
as float32 kernels on values rounded to half (``emulation``); ``rounding`` turns those
rounding Cast pairs into ``RoundToHalf`` nodes for graphs run where that op is loaded.  It
never modifies its input and keeps no state between calls.

May import: the shared basics only (``tfamp_rewrite.errors``, ``.dtypes``, ``.tf_compat``).
Every other capability builds on this one, so nothing here may import them.
"""
