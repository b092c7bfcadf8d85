"""Whether the mixed precision graph rewrite is enabled in this process.

``enable_mixed_precision_graph_rewrite`` sets the flag and
``disable_mixed_precision_graph_rewrite`` clears it.  The session module (still to be
written) will consume it: it reads ``is_enabled()`` when a Session is created, as
TensorFlow's ``BaseSession`` reads its ``mixed_precision_graph_rewrite_is_enabled`` flag,
so only Sessions created while the flag is set run the rewritten graph.  This module
holds that one flag and nothing else.
"""
from __future__ import annotations

_graph_rewrite_enabled = False


def is_enabled():
    """True while the graph rewrite is enabled for Sessions created from now on."""
    return _graph_rewrite_enabled


def set_enabled(enabled):
    """Sets the process-wide flag; ``enable_…`` / ``disable_…`` are the public way."""
    global _graph_rewrite_enabled
    _graph_rewrite_enabled = bool(enabled)
