"""MkDocs hook: the command-line and settings references, generated from the code.

A page line `<!-- cli-help: akosim -->` (or `akorun`) becomes that tool's `--help` and
the `--help` of each of its commands, as the installed code prints them, and a line
`<!-- settings-reference -->` every settings key of the registered schemes
(akocore.settings.reference), so the references never drift from the parsers and
the schemes' settings.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- cli-help: (akosim|akorun) -->$", re.MULTILINE)
SETTINGS_MARKER = re.compile(r"^<!-- settings-reference -->$", re.MULTILINE)
WIDTH = "90"  # columns of help text: what a code block of the Material theme shows


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return parser.format_help().rstrip()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_markdown(tool: str) -> str:
    """`tool`'s help and each command's, as Markdown sections."""
    module = {"akosim": "akosim.cli", "akorun": "akorun.launching.commands"}[tool]
    parser = importlib.import_module(module).build_parser()
    parts = [f"```text\n{_help(parser)}\n```\n"]
    for name, command in _commands(parser).items():
        parts.append(f"### {tool} {name}\n\n```text\n{_help(command)}\n```\n")
    return "\n".join(parts)


def on_config(config: Any) -> Any:
    """Import the tools from the checkout the site is built from."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def settings_markdown() -> str:
    return str(importlib.import_module("akocore.settings.reference").reference_markdown())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = SETTINGS_MARKER.sub(lambda match: settings_markdown(), markdown)
    return MARKER.sub(lambda match: cli_markdown(match.group(1)), markdown)
