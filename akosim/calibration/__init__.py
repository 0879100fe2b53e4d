"""Calibration: adopting a run's measurements, host probes, their caches."""
