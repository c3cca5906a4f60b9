"""The model optimisation toolchain behind ``inferway optimize`` (docs/optimize.md)."""
