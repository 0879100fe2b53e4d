"""nox sessions: tests (the CI gate), lint, docs, bench, experiments, ns3 (none run by tests)."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
CACHE_ENV = {"JAX_PLATFORMS": "cpu", "AKO_JAX_CACHE": os.path.abspath(".cache/jax")}


def _install_fault_tools(session: nox.Session) -> None:
    """In CI as root, install iptables so the real-network fault tests run instead of skipping.

    Best effort: without apt or a package mirror the tests that need it skip and say why.
    """
    if os.environ.get("CI") != "true" or os.geteuid() != 0 or shutil.which("iptables"):
        return
    if shutil.which("apt-get") is None:
        return
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "iptables", "iproute2"]):
        session.run(*command, external=True, success_codes=list(range(256)))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Install the package with its test extra and run the test suite on three pytest-xdist
    workers (`--dist loadscope` as tests/conftest.py refines it: a module's tests that share
    a setup stay on one worker, every other test goes to whichever worker is free, the long
    real-network modules first, a `solo` test alone). Three on two cores: the real-network
    fault runs mostly wait (a cut, a pause, a peer timeout: 7-17 CPU s in 20-100 s), and a
    third worker computes meanwhile.

    `nox -s tests -- -n 0` runs it in one process; other arguments go to pytest.
    """
    _install_fault_tools(session)
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-n", "3", "--dist", "loadscope", "--durations=25",
                *session.posargs, env=CACHE_ENV)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over the three packages and the analysis."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "akocore", "akosim", "akorun", "tests", "analysis", "noxfile.py")
    session.run("mypy", "akocore", "akosim", "akorun", "analysis")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs.yml) into site/, strictly: a broken link fails.

    `nox -s docs -- serve` previews it instead (mkdocs serve).
    """
    session.install("-e", ".[docs]")
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:], env=CACHE_ENV)
        return
    session.run("mkdocs", "build", "--strict", *session.posargs, env=CACHE_ENV)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Regression benchmarks: each figure a ratio to a reference of its own kind (bare
    SimPy loop, plain JAX step, blocking socket, numpy copy) timed beside it in repeated
    pairs, judged on the interval of the paired ratios' median against
    tests/bench/baseline.json and the tolerance it stores per figure.

    `nox -s bench -- --only akosim` runs one module; `-- --update-baseline` stores
    this run (and its environment) as the new baseline.
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.bench", *session.posargs, env=CACHE_ENV)


@nox.session(python=PYTHON)
def experiments(session: nox.Session) -> None:
    """The seeds' experiment matrix in every backend, then the report (long: hours).

    `nox -s experiments -- --subset ci` runs the tiny CI subset into results/experiments-ci;
    other arguments go to `python -m analysis.run` (e.g. `-- --only 'uniform-wan/*'`, or
    `-- --jobs 2` to run two akosim configurations at once; akorun always runs alone).
    """
    session.install("-e", ".[plot]")
    args = list(session.posargs)
    results = "results/experiments-ci" if "ci" in args else "results/experiments"
    session.run("python", "-m", "analysis.run", "--backend", "all", "--results", results,
                *args, env=CACHE_ENV)
    out = "docs/reports/experiments" if results == "results/experiments" else f"{results}/report"
    page = ["--page", f"{out}/index.md"] if results == "results/experiments" else []
    session.run("python", "-m", "analysis", "--results", results, "--out", out, *page,
                env=CACHE_ENV)


@nox.session(python=PYTHON)
def ns3(session: nox.Session) -> None:
    """Cross-check akosim against ns-3 (analysis/ns3_crosscheck; ~10 min on one core).

    Installs the `ns3` extra, runs the cross-check's own tests (they skip without
    ns-3 elsewhere), then the grid into analysis/data/ns3_crosscheck.json and prints
    its table. `nox -s ns3 -- --grid tiny` runs one small case per pattern;
    the grid runs akosim's max-min and TCP-aware models (`--model` replaces them).
    """
    session.install("-e", ".[ns3,test]")
    session.run("pytest", "-q", "tests/test_ns3_crosscheck.py", env=CACHE_ENV)
    models = () if "--model" in session.posargs else ("--model", "maxmin", "--model", "tcp")
    session.run("python", "-m", "analysis.ns3_crosscheck", "run", *models, *session.posargs,
                env=CACHE_ENV)
