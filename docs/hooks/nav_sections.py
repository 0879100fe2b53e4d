"""MkDocs hook: pages a section's folder holds but mkdocs.yml's nav omits join that section.

Each top-level nav section whose pages live in one folder (guide/, reference/, design/,
reports/) gets every Markdown file directly in that folder that the nav lists nowhere,
appended in name order with the page's own title. A new page therefore appears in the
site without an edit to mkdocs.yml; listing it in the nav gives it its place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _listed(nav: Any) -> set[str]:
    """Every page path the nav names, at any depth."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_listed(v) for v in nav.values())) if nav else set()
    if isinstance(nav, list):
        return set().union(*(_listed(v) for v in nav)) if nav else set()
    return set()


def _folder(entries: list[Any]) -> str | None:
    """The folder all of a section's pages share ('guide'), or None."""
    folders = {path.split("/", 1)[0] for path in _listed(entries) if "/" in path}
    return folders.pop() if len(folders) == 1 else None


def on_config(config: Any) -> Any:
    nav = config.get("nav")
    if not nav:
        return config
    docs = Path(config["docs_dir"])
    listed = _listed(nav)
    for item in nav:
        if not isinstance(item, dict):
            continue
        for entries in item.values():
            if not isinstance(entries, list):
                continue
            folder = _folder(entries)
            if folder is None:
                continue
            for page in sorted((docs / folder).glob("*.md")):
                path = f"{folder}/{page.name}"
                if path not in listed:
                    entries.append(path)
                    listed.add(path)
    return config
