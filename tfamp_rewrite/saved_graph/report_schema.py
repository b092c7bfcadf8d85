"""JSON Schema (draft-07) of the report ``tfamp-rewrite convert/explain --report FILE.json`` writes.

``SCHEMA`` is the contract for tools that read reports: every object lists its required
keys and their types.  Objects of this command line are closed (no other keys); the
rewrite's own ``RewriteReport`` is open, so the pass may grow fields.
``python -m tfamp_rewrite.saved_graph.report_schema`` prints it.
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
                                 "top1_agreement": NULLABLE_NUMBER, "nonfinite": INTEGER, "passed": BOOLEAN}),
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
        "functions": _array(_ref("FunctionReport")), "notes": STRINGS,
        "tensor_cores": _nullable("TensorCoreReport"), "numerics": {"enum": ["native", "emulate"]},
        "emulation": _nullable("EmulationReport")}, closed=False),
    "EmulationReport": _object({"nodes": INTEGER, "rounding_casts": INTEGER, "widening_casts": INTEGER,
                                "narrowing_casts": INTEGER,
                                "rounded_outputs": {"type": "object", "additionalProperties": STRING}}),
}

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
        "validation": _nullable("ValidationReport"), "warnings": STRINGS}),
}


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(SCHEMA, indent=1))
