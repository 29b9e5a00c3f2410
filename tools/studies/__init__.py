"""Tooling of the studies that is Python: the protocol's equal-time presets."""
