"""dispatchtune.features: candidate tables -> documented, columnar feature tables."""

from dispatchtune.features.extract import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FEATURES,
    FeatureExtractor,
    FeatureSpec,
    GemmFeatureExtractor,
    ProblemScalars,
    TargetScalars,
    check_feature_schema,
    compute_features,
    extract_features,
    feature_table_markdown,
    features_frame,
)

__all__ = [
    "FEATURES",
    "FEATURE_NAMES",
    "FEATURE_SCHEMA_VERSION",
    "FeatureExtractor",
    "FeatureSpec",
    "GemmFeatureExtractor",
    "ProblemScalars",
    "TargetScalars",
    "check_feature_schema",
    "compute_features",
    "extract_features",
    "feature_table_markdown",
    "features_frame",
]
