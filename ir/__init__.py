"""IREE IR in and out: reading root ops from MLIR (`frontend`), writing and reading tuning specs (`spec`)."""
