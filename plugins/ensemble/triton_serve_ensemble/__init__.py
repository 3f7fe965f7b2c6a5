"""Triton ensembles for triton-serve: a scheduler that runs a model's ``ensemble_scheduling`` steps."""
