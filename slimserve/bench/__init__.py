"""Benchmarks (``slimserve bench ...``): speed is measured here, never asserted in unit tests."""
