"""Reproducible benchmarks, each measured against a baseline in the same process."""
