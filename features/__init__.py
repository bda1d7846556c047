"""The one definition of every feature and wire type (see docs/wire-api.md), and the model
layer below both servers: ``manifest`` (the typed bundle manifest), ``bundle`` (manifest rules
and bundle directories on disk), ``loaded`` (a bundle ready to predict), ``scoring`` (pinball
loss, coverage)."""
from .matrix import FEATURES, TARGETS, feature_names, model_matrix, monotone_constraints, raw_matrix
from .schema import (
    COL,
    MAX_INT,
    POD_TYPES,
    RAW_COLUMNS,
    ROW_FIELDS,
    SCHEMA_VERSION,
    FieldError,
    TrainingEntry,
    parse_row,
    parse_training_entry,
    row_from_raw,
    row_json_schema,
    training_entry_json_schema,
)

__all__ = [
    "COL", "FEATURES", "FieldError", "MAX_INT", "POD_TYPES", "RAW_COLUMNS", "ROW_FIELDS", "SCHEMA_VERSION",
    "TARGETS", "TrainingEntry", "feature_names", "model_matrix", "monotone_constraints", "parse_row",
    "parse_training_entry", "raw_matrix", "row_from_raw", "row_json_schema", "training_entry_json_schema",
]
