"""The validation table's figures mean what their headers say (validate.compare)."""
from __future__ import annotations

import numpy as np

from tfamp_rewrite.saved_graph.validate import ValidationReport, compare


def test_relative_error_is_absent_where_no_original_value_exceeds_atol():
    tiny = np.full([2, 3], 1e-6, np.float32)
    result = compare("probs", tiny, tiny * 1.5, rtol=1e-3, atol=1e-3)
    assert result.max_rel_error is None and result.max_abs_error > 0
    report = ValidationReport(rtol=1e-3, atol=1e-3, inputs="x", outputs=[result])
    (row,) = [line for line in report.summary_lines() if line.strip().startswith("probs")]
    assert row.split()[3] == "-"


def test_relative_error_counts_the_values_beyond_atol():
    original = np.array([[1.0, 2.0, 1e-6]], np.float32)
    result = compare("y", original, original * np.float32(1.01), rtol=1e-1, atol=1e-3)
    assert abs(result.max_rel_error - 0.01) < 1e-6 and result.passed


def test_top1_agreement_is_for_floating_outputs_only():
    ids = np.array([[3, 1], [2, 2]], np.int64)
    assert compare("ids", ids, ids, rtol=0, atol=0).top1_agreement is None
    logits = np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)
    assert compare("logits", logits, logits[:, ::-1], rtol=0, atol=0).top1_agreement == 0.0


def test_a_row_beyond_both_printed_tolerances_passes_only_under_the_stated_criterion():
    """Max abs error (a large value) and max rel error (a small one) come from different
    elements; neither element exceeds atol + rtol x |original|, so the row passes, and the
    header says that this is the criterion."""
    original = np.array([100.0, 0.02], np.float32)
    result = compare("y", original, original + np.array([0.5, 0.009], np.float32), rtol=1e-2, atol=1e-2)
    assert result.passed and result.max_abs_error > 1e-2 and result.max_rel_error > 1e-2
    report = ValidationReport(rtol=1e-2, atol=1e-2, inputs="x", outputs=[result])
    assert "passed (every element within atol + rtol x |original|; rtol=0.01, atol=0.01)" in \
        report.summary_lines()[0]


def test_a_changed_shape_is_said_as_one_not_as_an_infinite_error():
    """boolean_mask or NMS keep one element fewer when a half value falls below a threshold:
    no value is infinite and no tolerance would cover it."""
    result = compare("kept", np.array([0.3, 0.9, 0.5], np.float32), np.array([0.9, 0.5], np.float32),
                     rtol=1e-2, atol=1e-2)
    assert not result.passed and result.shapes == "(3,) -> (2,)"
    assert result.max_abs_error is None and result.max_rel_error is None
    report = ValidationReport(rtol=1e-2, atol=1e-2, inputs="x", outputs=[result])
    (row,) = [line for line in report.summary_lines() if line.strip().startswith("kept")]
    assert "inf" not in row and "shape (3,) -> (2,): no tolerance covers it" in row
