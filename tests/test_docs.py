"""The documentation: the README stays short and keeps its two commands; the site builds.

The site is built with MkDocs in strict mode (a broken link between pages, a missing
anchor or a page the nav names but that does not exist fails it) into a temporary
folder, from a copy of the docs so the checks on the nav hook cannot touch the
repository. Skipped, saying why, when the docs tools are not installed (the `test`
extra installs them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INSTALL_AND_PLAN = "pip install . && akosim --workers 64 --bandwidth 40mbps --p auto"
INSTALL_AND_TEST = "pip install nox && nox -s tests"
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+|#\d{2,}\b", re.IGNORECASE)


def _mkdocs_or_skip() -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -e "
                                           f"'.[docs]' to build the documentation site")


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(project / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=project, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
             "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)})


def _copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def test_the_readme_is_short_and_holds_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert INSTALL_AND_PLAN in text and INSTALL_AND_TEST in text


def test_user_facing_pages_speak_of_the_product_not_of_issue_numbers() -> None:
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}: {match.group(0)}" for page in pages
             for match in ISSUE_NUMBER.finditer(page.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_ci_script_runs_the_readmes_test_command() -> None:
    assert INSTALL_AND_TEST in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_site_builds_strictly_with_generated_cli_and_api_pages(tmp_path: Path) -> None:
    _mkdocs_or_skip()
    site = tmp_path / "site"
    built = _build(ROOT, site)
    assert built.returncode == 0, built.stdout + built.stderr
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "usage: akosim" in cli and "usage: akorun" in cli and "--bandwidth" in cli
    assert not ISSUE_NUMBER.search(cli)  # the generated help too
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "akocore.records.results.RunResult" in api and "akocore.workloads.flat" in api
    data = [p for p in site.rglob("*") if p.suffix in {".json", ".jsonl"}
            and p.parent.name != "search"]
    assert not data, f"report data belongs in analysis/data, not in the site: {data}"


def test_a_page_missing_from_the_nav_joins_its_section(tmp_path: Path) -> None:
    _mkdocs_or_skip()
    project = _copy_project(tmp_path)
    (project / "docs" / "guide" / "zz-new-feature.md").write_text(
        "# A new feature\n\nSee [Install](install.md).\n", encoding="utf-8")
    site = tmp_path / "site"
    built = _build(project, site)
    assert built.returncode == 0, built.stdout + built.stderr
    page = (site / "guide" / "zz-new-feature" / "index.html").read_text(encoding="utf-8")
    assert "A new feature" in page
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "guide/zz-new-feature/" in home  # in the navigation of every page


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    _mkdocs_or_skip()
    project = _copy_project(tmp_path)
    (project / "docs" / "guide" / "zz-broken.md").write_text(
        "# Broken\n\nSee [nothing](no-such-page.md).\n", encoding="utf-8")
    built = _build(project, tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stdout + built.stderr


def test_the_readmes_own_model_loads_and_takes_a_gradient_step(tmp_path: Path) -> None:
    """The README's "train your own model" file, written outside the repository, is a
    working factory: it loads by path, has the parameters its code says, and steps."""
    import numpy as np

    from akocore.workloads.flat import build_workload

    text = README.read_text(encoding="utf-8")
    start = text.index("```python\n# mymodel.py") + len("```python\n")
    (tmp_path / "mymodel.py").write_text(text[start:text.index("```", start)])
    workload = build_workload(f"{tmp_path}/mymodel.py:make", batch_size=16)
    assert workload.param_count == 16 * 64 + 64 + 64 * 2 + 2
    batch = workload.batches(0, 1).next()
    loss, grad = workload.grad_step(workload.init_params, batch.x, batch.y)
    assert np.isfinite(loss) and grad.shape == (workload.param_count,)
