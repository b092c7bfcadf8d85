"""Matrix decompositions, and the half nodes that computed the matrices they are given.

A decomposition (Cholesky, an eigen decomposition, an inverse, a solve, an SVD) of a
matrix computed in half fails, or fills NaN, where float32's does not: a value past the
half range makes the matrix inf/nan, and rounding can leave a covariance or kernel matrix
that was positive definite in float32 indefinite (a Cholesky on the CPU then fills NaN
rather than failing).  ``nearest_half_producers`` names the half nodes to keep float32.
"""
from __future__ import annotations

from typing import Callable, List

# Ops whose kernels fail the run (or fill NaN) on a matrix they cannot decompose
DECOMPOSITIONS = frozenset({
    "Cholesky", "BatchCholesky", "SelfAdjointEig", "SelfAdjointEigV2", "BatchSelfAdjointEig",
    "BatchSelfAdjointEigV2", "MatrixInverse", "BatchMatrixInverse", "MatrixSolve", "BatchMatrixSolve",
    "MatrixSolveLs", "Svd", "Qr", "Lu", "Eig", "MatrixSquareRoot", "MatrixLogarithm"})


def nearest_half_producers(op, is_half: Callable, passes: Callable = lambda each: False) -> List:
    """The ops ``is_half`` accepts nearest up from ``op``'s inputs (the walk stops at each,
    but at those ``passes`` accepts: half ops that only pass values on), sorted by name: the
    half nodes whose values ``op`` is given, through float32 ones."""
    found, stack, seen = set(), [t.op for t in op.inputs], set()
    while stack:
        each = stack.pop()
        if each in seen:
            continue
        seen.add(each)
        if is_half(each) and not passes(each):
            found.add(each)
        else:
            stack.extend(t.op for t in each.inputs)
    return sorted(found, key=lambda each: each.name)
