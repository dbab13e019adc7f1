"""dispatchtune.features: candidate tables -> documented, columnar feature tables.

- `extract`: the feature definitions and the columnar extractor;
- `kerneltuner`: Kernel Tuner GEMM spaces mapped onto the candidate vocabulary;
- `spaces`: the feature table of a measured space (`space_features`).
"""

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
