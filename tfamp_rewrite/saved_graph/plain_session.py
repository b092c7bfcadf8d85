"""A TensorFlow session that runs a graph exactly as it is, whatever the process has switched on.

``--validate`` compares the original graph with the converted one, so the original must run
as it is: not in ``tfamp_rewrite``'s rewriting Session, which ``tf.compat.v1.Session()``
constructs while mixed precision is active (NGC containers set ``TF_ENABLE_AUTO_MIXED_PRECISION=1``
for every process, this command line's included), and not through Grappler's own AMP pass,
which NVIDIA's TensorFlow builds switch on with the same variable.
"""
from __future__ import annotations

import functools

from ..tf_compat import config_without_tf_amp


def plain_session(graph):
    """A ``tf.compat.v1.Session`` on ``graph`` with no mixed-precision rewrite of any kind."""
    return _plain_session_class()(graph=graph, config=config_without_tf_amp())


@functools.lru_cache(maxsize=None)
def _plain_session_class():
    import tensorflow as tf

    class PlainSession(tf.compat.v1.Session):
        """TensorFlow's Session; the activation switch redirects only ``tf.compat.v1.Session`` itself."""

    return PlainSession
