"""Nested feed / fetch structures for ``Session.run``, and the check that two results agree.

``assert_same_results(expected, actual, rtol, atol)``: ``actual`` has exactly the structure of
``expected`` -- the same type at every level (list, tuple, namedtuple, dict, OrderedDict,
SparseTensorValue, IndexedSlicesValue, numpy array or scalar, None for an operation), the
same keys in the same order, the same lengths -- and the same values: arrays of the same
dtype and shape, floating ones within ``np.allclose(actual, expected, rtol, atol)``, all
others exactly equal.

The strategies build structures of placeholders (``LEAF``) that ``fill`` then replaces,
in order, by graph elements -- so a feed key can use each tensor at most once.
"""
from __future__ import annotations

import collections
import collections.abc

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

Pair = collections.namedtuple("Pair", "first second")  # a user's own namedtuple
LSTMStateTuple = tf.compat.v1.nn.rnn_cell.LSTMStateTuple


class _Leaf:
    def __repr__(self):
        return "LEAF"


LEAF = _Leaf()


class Hook:
    """A fetch-dict key that is neither a string nor sortable, as MonitoredSession's hooks."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "Hook(%s)" % self.name


HOOKS = (Hook("a"), Hook("b"), Hook("c"))


def assert_same_results(expected, actual, rtol, atol, path="result"):
    """``actual`` is ``expected``'s structure with its values (see module docstring)."""
    assert type(actual) is type(expected), "%s: %r is a %s, TensorFlow gives a %s" % (
        path, actual, type(actual).__name__, type(expected).__name__)
    if expected is None:
        return
    if isinstance(expected, (np.ndarray, np.generic)):
        assert actual.dtype == expected.dtype and np.shape(actual) == np.shape(expected), (
            "%s: %s%s, TensorFlow gives %s%s" % (path, actual.dtype, np.shape(actual),
                                                 expected.dtype, np.shape(expected)))
        if np.issubdtype(expected.dtype, np.floating):
            assert np.allclose(actual, expected, rtol=rtol, atol=atol), (
                "%s: largest difference %g\n%r\n%r" % (
                    path, np.max(np.abs(np.asarray(actual, np.float64) - expected)), actual, expected))
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
        return
    if isinstance(expected, collections.abc.Mapping):
        assert list(actual) == list(expected), "%s: keys %r, TensorFlow gives %r" % (
            path, list(actual), list(expected))
        if isinstance(expected, collections.defaultdict):
            assert actual.default_factory is expected.default_factory, path
        for key in expected:
            assert_same_results(expected[key], actual[key], rtol, atol, "%s[%r]" % (path, key))
        return
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), "%s: %d items, TensorFlow gives %d" % (
            path, len(actual), len(expected))
        for index, (want, got) in enumerate(zip(expected, actual)):
            assert_same_results(want, got, rtol, atol, "%s[%d]" % (path, index))
        return
    attributes = getattr(type(expected), "__attrs_attrs__", None)
    if attributes is not None:
        for attribute in attributes:
            assert_same_results(getattr(expected, attribute.name), getattr(actual, attribute.name),
                                rtol, atol, "%s.%s" % (path, attribute.name))
        return
    assert actual == expected, path


def max_difference(expected, actual) -> float:
    """The largest absolute difference between the floating arrays of two same-shaped results."""
    if isinstance(expected, (np.ndarray, np.generic)):
        if np.issubdtype(expected.dtype, np.floating) and np.size(expected):
            return float(np.max(np.abs(np.asarray(actual, np.float64) - expected)))
        return 0.0
    if isinstance(expected, collections.abc.Mapping):
        return max([max_difference(expected[key], actual[key]) for key in expected], default=0.0)
    if isinstance(expected, (list, tuple)):
        return max([max_difference(want, got) for want, got in zip(expected, actual)], default=0.0)
    return 0.0


# -- structures ----------------------------------------------------------------------
def rebuild(structure, leaf_fn, containers=None):
    """``structure`` with each leaf replaced by ``leaf_fn(leaf)``; lists, tuples, namedtuples
    and dicts keep their types unless ``containers`` (a type) replaces every sequence's."""
    def walk(item):
        if isinstance(item, collections.abc.Mapping):
            return type(item)((key, walk(value)) for key, value in item.items())
        if isinstance(item, (list, tuple)):
            items = [walk(value) for value in item]
            if containers is not None:
                return containers(items)
            if hasattr(item, "_fields"):
                return type(item)(*items)
            return type(item)(items)
        return leaf_fn(item)

    return walk(structure)


def leaves(structure) -> list:
    """The leaves of nested lists / tuples / namedtuples, in order (as ``nest.flatten``)."""
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in leaves(item)]
    return [structure]


def leaf_count(structure) -> int:
    return len(leaves(structure))


def fill(structure, leaves):
    """``structure`` with its ``LEAF`` markers replaced, in order, by the items of ``leaves``."""
    iterator = iter(leaves)
    return rebuild(structure, lambda leaf: next(iterator) if leaf is LEAF else leaf)


def nested_keys(max_leaves=4):
    """Feed-key structures: ``LEAF``, or tuples / ``Pair`` / ``LSTMStateTuple`` of them, nested."""
    return st.recursive(st.just(LEAF), lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.builds(Pair, children, children),
        st.builds(LSTMStateTuple, children, children),
    ), max_leaves=max_leaves)


def nested_fetches(leaves, max_leaves=8):
    """Fetch structures over ``leaves``: lists, tuples, namedtuples, dicts (text or object
    keys) and OrderedDicts, nested."""
    def containers(children):
        return st.one_of(
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.builds(Pair, children, children),
            st.dictionaries(st.sampled_from("xyz"), children, max_size=3),
            st.lists(st.tuples(st.sampled_from("xyz"), children), max_size=3).map(collections.OrderedDict),
            st.dictionaries(st.sampled_from(HOOKS), children, max_size=3),
        )

    return st.recursive(leaves, containers, max_leaves=max_leaves)
