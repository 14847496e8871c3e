"""Benchmarks that run against a local cluster of real processes."""
