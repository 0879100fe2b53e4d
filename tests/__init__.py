"""The test suite (pytest); tests/bench holds the regression benchmarks."""
