"""The MLflow Model Registry mirror: which versions to sync, the MLflow client's operations, and
what a mirrored version looks like there."""
