"""Errors raised by the rewrite."""
from __future__ import annotations


class GraphRewriteError(ValueError):
    """The graph cannot be rewritten because it is malformed.

    ``node`` names the offending node (or is None when the problem is global).
    """

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node
