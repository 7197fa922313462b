"""Figures rendered from the experiments' computed numbers (matplotlib)."""
