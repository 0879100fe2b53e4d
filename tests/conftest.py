"""Test-wide settings: CPU-only JAX with a project-local compilation cache, and how the
suite runs on pytest-xdist workers (the nox session: `-n 3 --dist loadscope`).

Under xdist (only then):
- scheduling (`ModuleOrTestScheduling`): the tests of a module that holds a setup wider
  than a test (a `scope=` fixture, `setup_module`, `setUpClass`: often one akorun run or
  one experiment several tests check) go to one worker, so the setup is made once; every
  other test goes on its own to whichever worker is free;
- order: the modules of the long real-network runs first (`LONG_MODULES_FIRST`), so the
  last tests to start are short ones and both workers end about together;
- `@pytest.mark.solo`: a test that measures time (an RTT, a rate) runs while the other
  worker waits between two of its tests (`_SoloLock`).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("AKO_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache",
                                                     "jax"))

# akosim's --compute measure cache: never the user's (every test process and its children)
if "AKO_CACHE_DIR" not in os.environ:
    os.environ["AKO_CACHE_DIR"] = tempfile.mkdtemp(prefix="ako-test-cache-")

TESTS = Path(__file__).resolve().parent

# the modules whose tests run longest in total (seconds of real-network runs, or of plans
# that train), longest first: started first under xdist; a scheduling hint only (a module
# missing here still runs)
LONG_MODULES_FIRST = (
    "test_faults_netns.py", "test_examples.py", "test_experiments.py",
    "test_plan_target_accuracy.py", "test_schemes_akorun.py", "test_stop_agreement.py",
    "test_testbed_netns.py", "test_security_live.py", "test_examples_api.py",
    "test_faults_relay.py", "test_workload_protocol.py", "test_akorun_run.py",
    "test_testbed_delay.py", "test_faults_join.py", "test_diloco_akorun.py",
    "test_launch_sigterm_startup.py", "test_faults_schemes.py", "test_codecs_akorun.py",
    "test_maxmin_compiled.py", "test_launch_plan.py",
)
_SHARED_SETUP_MARKS = ("scope=", "setup_module", "setUpClass")


def _holds_a_shared_setup(module_path: str) -> bool:
    """Whether the test module at `module_path` (relative to the rootdir or absolute) sets
    up something for more than one test: then its tests stay on one worker."""
    path = Path(module_path)
    if not path.is_absolute():
        path = TESTS.parent / path
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return True  # not a file we can read: keep it together, the safe choice
    return any(mark in text for mark in _SHARED_SETUP_MARKS)


class _Scheduling:
    """Registered only when pytest-xdist is installed (its hook is unknown otherwise)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadscope":
            return None
        config.option.loadscopereorder = False  # keep the collection's order (long first)
        from xdist.scheduler import LoadScopeScheduling

        class ModuleOrTestScheduling(LoadScopeScheduling):  # type: ignore[misc]
            """loadscope, with a module split into single tests when nothing is shared."""

            shared: dict[str, bool] = {}

            def _split_scope(self, nodeid: str) -> str:
                module = nodeid.split("::", 1)[0]
                if module not in self.shared:
                    self.shared[module] = _holds_a_shared_setup(module)
                return module if self.shared[module] else nodeid

        return ModuleOrTestScheduling(config, log)


class _SoloLock:
    """Every test of a worker holds a shared lock while it runs; a `solo` test takes it
    exclusively. A gate lock taken before either keeps a waiting solo test from being
    overtaken by the other worker's next tests (flock: released when the process ends)."""

    def __init__(self, folder: Path) -> None:
        self.gate = open(folder / "ako-solo.gate", "a")  # noqa: SIM115
        self.main = open(folder / "ako-solo.lock", "a")  # noqa: SIM115

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        solo = item.get_closest_marker("solo") is not None
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.main, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        finally:
            if not solo:
                fcntl.flock(self.gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.main, fcntl.LOCK_UN)
            if solo:
                fcntl.flock(self.gate, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Scheduling(), "ako-xdist-scheduling")
    basetemp = config.getoption("basetemp", None)
    if os.environ.get("PYTEST_XDIST_WORKER") and basetemp:
        # a worker's basetemp is <the run's folder>/popen-gwN: the locks go in the run's
        config.pluginmanager.register(_SoloLock(Path(basetemp).parent), "ako-xdist-solo")


def _module_rank(item: pytest.Item) -> int:
    name = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return LONG_MODULES_FIRST.index(name) if name in LONG_MODULES_FIRST else \
        len(LONG_MODULES_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the long modules first (a stable sort: the same order on every worker,
    and a module's tests keep theirs)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_module_rank)
