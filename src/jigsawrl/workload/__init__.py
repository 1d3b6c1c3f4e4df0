"""Workload layer: accelerator, model and task presets, and the pipelines built from a config."""
