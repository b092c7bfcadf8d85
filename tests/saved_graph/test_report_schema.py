"""The --report JSON follows report_schema.SCHEMA, and the schema follows the dataclasses."""
from __future__ import annotations

import copy
import dataclasses
import json

import jsonschema
import pytest
import saved_graph_models as models
from cli_helpers import run_main

from tfamp_rewrite.doctor.advice import LossScaleAdvice, ScaleCheck
from tfamp_rewrite.doctor.fixes import Fix, Risk
from tfamp_rewrite.doctor.probes import HalfNode
from tfamp_rewrite.doctor.ranges import TensorRange
from tfamp_rewrite.doctor.report import DoctorReport, GradientSummary, Timing
from tfamp_rewrite.graph_rewrite.emulation import EmulationReport
from tfamp_rewrite.graph_rewrite.report import RewriteReport
from tfamp_rewrite.graph_rewrite.tensor_cores import Dimension, TensorCoreOp, TensorCoreReport
from tfamp_rewrite.saved_graph import conversion, report_schema
from tfamp_rewrite.saved_graph.auto_tune import AutoTuneReport, Trial
from tfamp_rewrite.saved_graph.calibration import CalibrationReport, KeptNode
from tfamp_rewrite.saved_graph.constants import ConstantRange, ConstantReport, FoldedConstant
from tfamp_rewrite.saved_graph.graph_io import GraphTensor
from tfamp_rewrite.saved_graph.validate import OutputComparison, ValidationReport

VALIDATOR = jsonschema.Draft7Validator(report_schema.SCHEMA)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report with every optional part filled: validation, out-of-range constants, Tensor Cores."""
    directory = tmp_path_factory.mktemp("schema")
    source = models.write_frozen(models.constants_graph(), str(directory / "c.pb"))
    path = directory / "report.json"
    code = run_main(_NoCapture(), "convert", source, str(directory / "out.pb"), "--validate", "--atol", "1e9",
                    "--rtol", "1e9", "--report", str(path))[0]
    assert code == 0
    return json.loads(path.read_text())


class _NoCapture:
    """A stand-in for pytest's capsys in a module-scoped fixture."""

    def readouterr(self):
        return "", ""


def test_schema_is_valid_draft7():
    jsonschema.Draft7Validator.check_schema(report_schema.SCHEMA)


def test_a_real_report_follows_the_schema(report):
    VALIDATOR.validate(report)
    assert report["constants"]["out_of_range"] and report["validation"]["outputs"]
    assert report["rewrite"]["tensor_cores"]["ops"][0]["dims"]


@pytest.mark.parametrize("path, value", [
    (("dtype",), "float8"),
    (("rewrite", "decisions", 0, "converted"), "yes"),
    (("rewrite", "tensor_cores", "ops", 0, "dims", 0, "size"), 3.5),
    (("constants", "out_of_range", 0, "overflow"), None),
    (("validation", "outputs", 0, "passed"), 1),
    (("inputs", 0, "surprise"), "not in the schema"),
])
def test_the_schema_rejects_wrong_types_and_unknown_keys(report, path, value):
    broken = copy.deepcopy(report)
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert list(VALIDATOR.iter_errors(broken))


@pytest.mark.parametrize("key", ["rewrite", "constants", "warnings", "validation"])
def test_the_schema_rejects_a_missing_key(report, key):
    broken = dict(report)
    del broken[key]
    assert list(VALIDATOR.iter_errors(broken))


@pytest.mark.parametrize("cls, name", [
    (conversion.ConversionReport, None), (RewriteReport, "RewriteReport"), (GraphTensor, "GraphTensor"),
    (ConstantReport, "ConstantReport"), (ConstantRange, "ConstantRange"), (FoldedConstant, "FoldedConstant"),
    (TensorCoreReport, "TensorCoreReport"), (TensorCoreOp, "TensorCoreOp"), (Dimension, "Dimension"),
    (ValidationReport, "ValidationReport"), (OutputComparison, "OutputComparison"),
    (EmulationReport, "EmulationReport"), (CalibrationReport, "CalibrationReport"), (KeptNode, "KeptNode"),
    (AutoTuneReport, "AutoTuneReport"), (Trial, "Trial"), (Risk, "Risk"), (Fix, "Fix"),
    (HalfNode, "HalfNode"),
    (DoctorReport, "doctor"), (TensorRange, "TensorRange"), (ScaleCheck, "ScaleCheck"),
    (LossScaleAdvice, "LossScaleAdvice"), (GradientSummary, "GradientSummary"), (Timing, "Timing"),
])
def test_the_schema_names_every_dataclass_field(cls, name):
    schema = {None: report_schema.SCHEMA, "doctor": report_schema.DOCTOR_SCHEMA}.get(name) or \
        report_schema.DEFINITIONS[name]
    assert set(schema["properties"]) == {field.name for field in dataclasses.fields(cls)}


def test_the_doctor_schema_is_valid_and_closed():
    jsonschema.Draft7Validator.check_schema(report_schema.DOCTOR_SCHEMA)
    report = {"dtype": "float16", "target": "gpu", "steps": 0, "batches": 0, "tensors_probed": 0,
              "skipped": {}, "scales": [], "overflow": [], "underflow": [], "gradients": None,
              "loss_scale": None, "timing": None, "tensors": [], "notes": []}
    validator = jsonschema.Draft7Validator(report_schema.DOCTOR_SCHEMA)
    validator.validate(report)
    assert list(validator.iter_errors(dict(report, surprise=1)))
    assert list(validator.iter_errors(dict(report, steps="3")))
