"""Errors raised by the rewrite and by the command line."""
from __future__ import annotations


class GraphRewriteError(ValueError):
    """The graph cannot be rewritten because it is malformed.

    ``node`` names the offending node (or is None when the problem is global).
    """

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


class ConversionError(Exception):
    """A problem with what the user asked for (a file, a path, an option), and its fix.

    ``str(error)`` is one sentence pair, ``"<problem>. <fix>"``, that the command line
    prints as a single line before exiting with status 2.
    """

    def __init__(self, problem: str, fix: str):
        super().__init__("%s. %s" % (problem.rstrip("."), fix))
        self.problem = problem
        self.fix = fix
