"""TensorFlow's run errors told of the user's graph, not the session's private one.

A rewriting session runs a private graph imported from the user's (shadow_graph.py).  An op
that fails there (a Reshape fed the wrong batch) raises an ``OpError`` whose ``op`` is the
private graph's, and whose message TensorFlow interpolated with the private op's stack --
which is empty, as imported ops have none.  The user then loses what float32 shows: where
the failing op was defined in their program.

``in_user_terms(error, user_graph, user_name)`` builds the error TensorFlow would have
raised running the user's graph: the same type and message, its ``op`` the user's op of
that name, and the user op's stack interpolated again from the unformatted message
TensorFlow raised first (the error's ``__context__``).  An error about an op only the
private graph has (a cast the rewrite added), or one with no such message, stays as it is.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

import tensorflow as tf
from tensorflow.python.framework import error_interpolation

from .generations import GENERATION_SCOPE_IN_TEXT

# "{{node name}}", the tag TensorFlow interpolates with the op's stack
_NODE_TAG = re.compile(r"\{\{node ([^}\s]+)\}\}")


def in_user_terms(error, user_graph, user_name: Callable[[str], str]) -> Optional[Exception]:
    """The user-graph version of ``error`` (raised by a private graph's run), or None when
    it has none (module docstring)."""
    raw = error.__context__
    if error.op is None or not isinstance(raw, tf.errors.OpError):
        return None
    user_op = _user_op(user_graph, user_name(error.op.name))
    if user_op is None:
        return None

    def renamed(match):
        name = user_name(match.group(1))
        return "{{node %s}}" % name if _user_op(user_graph, name) is not None else match.group(0)

    # a kernel naming its own op in the text (a histogram's "Infinity in Histogram for:")
    # names the private one, under a heal's generation scope
    text = GENERATION_SCOPE_IN_TEXT.sub("", _NODE_TAG.sub(renamed, raw.message))
    message = _interpolate(text, user_graph)
    try:
        found = type(error)(user_op.node_def, user_op, message)
    except TypeError:  # an OpError subclass with another constructor: leave it
        return None
    found.__context__ = raw
    return found


def raised_at(error_type, user_op, message: str) -> Exception:
    """The ``error_type`` (an OpError) TensorFlow raises where the kernel of ``user_op`` (a
    user graph's op) fails with ``message``: the op's stack interpolated as a run's is."""
    raw = "%s\n\t [[{{node %s}}]]" % (message, user_op.name)
    return error_type(user_op.node_def, user_op, _interpolate(raw, user_op.graph))


def _user_op(graph, name: str):
    try:
        return graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        return None


def _interpolate(message: str, graph) -> str:
    """``message`` with its node tags filled in from ``graph`` (TensorFlow 2.x names it
    ``interpolate_graph``, 1.15 ``interpolate``)."""
    interpolate = getattr(error_interpolation, "interpolate_graph", None)
    if interpolate is None:
        interpolate = error_interpolation.interpolate
    return interpolate(message, graph)
