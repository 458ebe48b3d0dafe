"""Declared features: the schema that says what each event field means to the model."""

from streamrec.features.schema import (
    BUILTIN,
    FeatureSchema,
    FeatureSpec,
    Kind,
    Role,
    Transform,
    Value,
    read_features,
    read_value,
)

__all__ = [
    "BUILTIN",
    "FeatureSchema",
    "FeatureSpec",
    "Kind",
    "Role",
    "Transform",
    "Value",
    "read_features",
    "read_value",
]
