"""JSON Schemas (draft-07) of the reports ``tfamp-rewrite ... --report FILE.json`` writes.

``SCHEMA``: ``convert`` and ``explain``; ``DOCTOR_SCHEMA``: ``doctor``.

``SCHEMA`` is the contract for tools that read reports: every object lists its required
keys and their types.  Objects of this command line are closed (no other keys); the
rewrite's own ``RewriteReport`` is open, so the pass may grow fields.
``python -m tfamp_rewrite.saved_graph.report_schema [doctor]`` prints one.
"""
from __future__ import annotations

import json

STRING, INTEGER = {"type": "string"}, {"type": "integer"}
NUMBER, BOOLEAN = {"type": "number"}, {"type": "boolean"}
NULLABLE_STRING = {"type": ["string", "null"]}
NULLABLE_NUMBER = {"type": ["number", "null"]}
NULLABLE_INTEGER = {"type": ["integer", "null"]}
STRINGS = {"type": "array", "items": STRING}


def _ref(name: str) -> dict:
    return {"$ref": "#/definitions/%s" % name}


def _array(item: dict) -> dict:
    return {"type": "array", "items": item}


def _nullable(name: str) -> dict:
    return {"oneOf": [{"type": "null"}, _ref(name)]}


def _object(properties: dict, closed: bool = True) -> dict:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": not closed}


_SHAPE = {"type": ["array", "null"], "items": NULLABLE_INTEGER}

DEFINITIONS = {
    "GraphTensor": _object({"key": STRING, "tensor": STRING, "dtype": STRING, "converted_dtype": STRING,
                            "shape": _SHAPE}),
    "NodeDecision": _object({"name": STRING, "op": STRING, "dtype": STRING, "reason": STRING,
                             "category": {"enum": ["allow", "infer", "deny", "clear", None]},
                             "converted": BOOLEAN, "related": NULLABLE_STRING, "rule": STRING}, closed=False),
    "CastInfo": _object({"name": STRING, "source": STRING, "port": INTEGER, "to_dtype": STRING,
                         "consumers": STRINGS}, closed=False),
    "FunctionReport": _object({"name": STRING, "status": {"enum": ["rewritten", "untouched"]},
                               "reason": STRING, "report": _nullable("RewriteReport")}, closed=False),
    "Dimension": _object({"name": {"enum": ["M", "N", "K", "C_in", "C_out"]}, "size": NULLABLE_INTEGER,
                          "padded": NULLABLE_INTEGER}),
    "TensorCoreOp": _object({"name": STRING, "op": STRING, "dtype": STRING, "half": BOOLEAN,
                             "flops": NULLABLE_INTEGER, "dims": _array(_ref("Dimension")),
                             "aligned": {"type": ["boolean", "null"]}, "fix": STRING, "reason": STRING}),
    "TensorCoreReport": _object({"dtype": STRING, "shape_source": STRING, "total_flops": INTEGER,
                                 "half_flops": INTEGER, "half_flop_share": NULLABLE_NUMBER,
                                 "per_example": BOOLEAN, "ops": _array(_ref("TensorCoreOp"))}),
    "ConstantRange": _object({"name": STRING, "consumers": STRINGS, "elements": INTEGER, "overflow": INTEGER,
                              "underflow": INTEGER, "max_abs": NUMBER, "min_abs_nonzero": NUMBER,
                              "action": STRING}),
    "FoldedConstant": _object({"name": STRING, "node": STRING, "elements": INTEGER, "consumers": STRINGS}),
    "ConstantReport": _object({"dtype": STRING, "policy": {"enum": ["keep-float32", "clamp"]},
                               "folded": INTEGER, "casts_removed": INTEGER, "bytes_before": INTEGER,
                               "bytes_after": INTEGER, "flushed_to_zero": INTEGER,
                               "out_of_range": _array(_ref("ConstantRange")),
                               "constants": _array(_ref("FoldedConstant"))}),
    "OutputComparison": _object({"name": STRING, "dtype": STRING, "converted_dtype": STRING,
                                 "max_abs_error": NULLABLE_NUMBER, "max_rel_error": NULLABLE_NUMBER,
                                 "top1_agreement": NULLABLE_NUMBER, "nonfinite": INTEGER, "passed": BOOLEAN,
                                 "shapes": NULLABLE_STRING}),
    "ValidationReport": _object({"rtol": NUMBER, "atol": NUMBER, "inputs": STRING,
                                 "numerics": {"enum": ["emulate", "native"]}, "numerics_reason": STRING,
                                 "passed": BOOLEAN,
                                 "outputs": _array(_ref("OutputComparison")), "seconds_original": NUMBER,
                                 "seconds_converted": NUMBER}),
    "RewriteReport": _object({
        "dtype": STRING, "target": STRING, "compat": STRING, "nodes_total": INTEGER,
        "nodes_processable": INTEGER, "nodes_recognized": INTEGER, "nodes_converted": INTEGER,
        "casts_added": INTEGER, "casts_to_half": INTEGER, "casts_to_float": INTEGER,
        "casts_to_half_excluding_constants": INTEGER, "allow_nodes_converted": INTEGER,
        "deny_nodes_blocking": INTEGER, "nodes_blocked_by_deny": INTEGER,
        "op_counts": {"type": "object", "additionalProperties": _object(
            {"total": INTEGER, "converted": INTEGER})},
        "casts": _array(_ref("CastInfo")), "decisions": _array(_ref("NodeDecision")),
        "functions": _array(_ref("FunctionReport")), "notes": STRINGS, "warnings": STRINGS,
        "nothing_converted_because": NULLABLE_STRING,
        "tensor_cores": _nullable("TensorCoreReport"), "numerics": {"enum": ["native", "emulate"]},
        "emulation": _nullable("EmulationReport")}, closed=False),
    "EmulationReport": _object({"nodes": INTEGER, "rounding_casts": INTEGER, "widening_casts": INTEGER,
                                "narrowing_casts": INTEGER, "gathers_rounding_rows": INTEGER,
                                "rounding_ops": INTEGER,
                                "native_half_nodes": INTEGER,
                                "rounded_outputs": {"type": "object", "additionalProperties": STRING}}),
}

_ROLE = {"enum": ["forward", "activation_gradient", "weight_gradient"]}
_CATEGORY = {"enum": ["allow", "infer", "deny", "clear", None]}
_COUNTS = {"type": "object", "additionalProperties": INTEGER}
_HISTOGRAM = _array({"type": "array", "items": INTEGER, "minItems": 2, "maxItems": 2})

# The precision doctor's objects: in --report of `doctor`, and (Risk, HalfNode, Fix) in
# a conversion's calibration report.
DOCTOR_DEFINITIONS = {
    "HalfNode": _object({"name": STRING, "op": STRING, "category": _CATEGORY}),
    "Fix": _object({"nodes": STRINGS, "env": STRING,
                    "lists": {"type": "object", "additionalProperties": STRINGS},
                    "nodes_to_exclude": STRINGS}),
    "Risk": _object({"kind": {"enum": ["overflow", "underflow"]}, "tensor": STRING, "node": STRING,
                     "op": STRING,
                     "category": _CATEGORY, "role": _ROLE, "fraction": NUMBER, "entire": BOOLEAN,
                     "scale": NUMBER,
                     "max_abs": NULLABLE_NUMBER, "min_abs_nonzero": NULLABLE_NUMBER,
                     "half_nodes": _array(_ref("HalfNode")), "fix": _nullable("Fix")}),
    "TensorRange": _object({"tensor": STRING, "node": STRING, "op": STRING, "category": _CATEGORY,
                            "role": _ROLE,
                            "half_nodes": _array(_ref("HalfNode")), "runs": INTEGER, "elements": INTEGER,
                            "zeros": INTEGER, "nonfinite": INTEGER, "max_abs": NULLABLE_NUMBER,
                            "min_abs_nonzero": NULLABLE_NUMBER, "overflow": INTEGER,
                            "run_scale_log2": NULLABLE_INTEGER, "histogram": _HISTOGRAM}),
    "ScaleCheck": _object({"scale": NUMBER, "overflow": NUMBER, "subnormal": NUMBER, "flush": NUMBER}),
    "LossScaleAdvice": _object({
        "recommended": NUMBER, "margin": NUMBER, "max_gradient": NULLABLE_NUMBER, "current": NULLABLE_NUMBER,
        "unscaled": _ref("ScaleCheck"), "at_current": _nullable("ScaleCheck"),
        "at_recommended": _ref("ScaleCheck"), "activation_unscaled": _nullable("ScaleCheck"),
        "step_spread_log2": NUMBER, "vanishing_tensors": INTEGER, "vanishing_values": INTEGER,
        "scaling_needed": BOOLEAN, "dynamic_needed": BOOLEAN, "verdict": STRING}),
    "GradientSummary": _object({"tensors": INTEGER, "activation_tensors": INTEGER, "weight_tensors": INTEGER,
                                "values": INTEGER, "zeros": INTEGER, "activation_zeros": INTEGER,
                                "activation_histogram": _HISTOGRAM, "weight_histogram": _HISTOGRAM}),
    "Timing": _object({"probed_step_seconds": NULLABLE_NUMBER, "plain_step_seconds": NULLABLE_NUMBER,
                       "probed_steps": INTEGER, "plain_steps": INTEGER}),
}
DEFINITIONS.update(DOCTOR_DEFINITIONS)
DEFINITIONS.update({
    "KeptNode": _object({"name": STRING, "op": STRING, "rule": {"enum": ["calibration", "auto_tune"]},
                         "reason": STRING}),
    "CalibrationReport": _object({"data": STRING, "batches": INTEGER, "overflow_threshold": NUMBER,
                                  "flush_threshold": NUMBER, "tensors_probed": INTEGER, "skipped": _COUNTS,
                                  "at_risk": _array(_ref("Risk")), "kept": _array(_ref("KeptNode"))}),
    "Trial": _object({"what": STRING, "kept": INTEGER, "passed": BOOLEAN, "max_abs_error": NULLABLE_NUMBER}),
    "AutoTuneReport": _object({"rtol": NUMBER, "atol": NUMBER, "start": INTEGER, "candidates": INTEGER,
                               "passed": BOOLEAN, "trials": _array(_ref("Trial")),
                               "kept": _array(_ref("KeptNode"))}),
})

SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "tfamp-rewrite conversion report",
    "definitions": DEFINITIONS,
    **_object({
        "input": STRING, "input_format": STRING, "output": NULLABLE_STRING,
        "dtype": {"enum": ["float16", "bfloat16"]}, "target": {"enum": ["gpu", "cpu"]},
        "keep_io_types": BOOLEAN, "out_of_range": {"enum": ["keep-float32", "clamp"]},
        "signature": NULLABLE_STRING, "inputs": _array(_ref("GraphTensor")),
        "outputs": _array(_ref("GraphTensor")), "excluded_nodes": STRINGS, "excluded_op_types": STRINGS,
        "included_op_types": STRINGS, "rewrite": _ref("RewriteReport"), "constants": _ref("ConstantReport"),
        "input_bytes": INTEGER, "output_bytes": NULLABLE_INTEGER, "seconds": NUMBER,
        "validation": _nullable("ValidationReport"), "warnings": STRINGS,
        "calibration": _nullable("CalibrationReport"), "auto_tune": _nullable("AutoTuneReport")}),
}

DOCTOR_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "tfamp-rewrite doctor report",
    "definitions": DOCTOR_DEFINITIONS,
    **_object({
        "dtype": {"enum": ["float16", "bfloat16"]}, "target": {"enum": ["gpu", "cpu"]}, "steps": INTEGER,
        "batches": INTEGER, "tensors_probed": INTEGER, "skipped": _COUNTS, "scales": _array(NUMBER),
        "overflow": _array(_ref("Risk")), "underflow": _array(_ref("Risk")),
        "gradients": _nullable("GradientSummary"), "loss_scale": _nullable("LossScaleAdvice"),
        "timing": _nullable("Timing"), "tensors": _array(_ref("TensorRange")), "notes": STRINGS}),
}


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(json.dumps(DOCTOR_SCHEMA if sys.argv[1:] == ["doctor"] else SCHEMA, indent=1))
