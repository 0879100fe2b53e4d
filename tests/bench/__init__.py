"""Regression benchmarks, run by `nox -s bench` (python -m tests.bench), never by tests."""
