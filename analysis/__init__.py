"""Experiments and their analysis: the seeds' study reproduced with both backends.

`python -m analysis` regenerates every table, plot and the fidelity report from
the result files (see analysis/__main__.py); `nox -s experiments` also runs
the experiments first.
"""
