"""Damaged saved graphs never get past ``tfamp-rewrite convert`` half-way (``support/cli_fuzz.py``).

Per format, a few hundred seeded mutations of a small valid model go through ``cli.main``
in this process.  Every case must end with exit 0 and an output TensorFlow imports (and,
for SavedModels, loads with its variables), or exit 2 with one line and nothing written;
no exception escapes, the input is never modified.  ``make fuzz`` runs 20 000 cases.  The
TF1-behaviour pass damages its own models (reference variables, v1 control flow) with a
third as many cases: the mutations and the checks are the same in both passes.
"""
import pytest
from cli_fuzz import FORMATS, format_table, run_fuzz
from tf1_behavior import tf1_behavior_requested

CASES = {"pb": 300, "pbtxt": 300, "meta": 300, "saved_model": 300, "variables_index": 200}
if tf1_behavior_requested():
    CASES = {fmt: count // 3 for fmt, count in CASES.items()}


@pytest.fixture(scope="module")
def tallies(tmp_path_factory):
    return run_fuzz(CASES, seed=12, workdir=str(tmp_path_factory.mktemp("fuzz")))


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_inputs_are_converted_or_refused_in_one_line(tallies, fmt):
    tally = tallies[fmt]
    assert tally.cases == CASES[fmt]
    assert tally.failure_count == 0, format_table({fmt: tally}, 0)
    # Both outcomes occur: damage the checks must refuse, and damage that leaves a valid model.
    assert tally.exit2 > 0 and tally.exit0 > 0, format_table({fmt: tally}, 0)
