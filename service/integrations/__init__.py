"""Bridges to the model registries teams already use (MLflow first)."""
