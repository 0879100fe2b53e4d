"""The settings reference: every key of the registered schemes as Markdown tables.

One table per section (``[cluster]``, ``[network]``, ``[exchange]``, ...), and one
per scheme's own table (``[exchange.diloco]``, ...), each row a key with its flag,
its built-in default and its one-line comment, all read from the key registry
(akocore.settings.key_registry), which reads the schemes' settings classes. The
documentation's hook (docs/hooks/cli_reference.py) puts it where a page says
``<!-- settings-reference -->``, so the reference never drifts from the code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from akocore.schemes.registry import registered
from akocore.settings.key_registry import Key, current


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(key: Key) -> str:
    value = key.dump(key.default)
    return "none" if value is None else json.dumps(value)


def _table(keys: Iterable[Key], prefix: str) -> str:
    rows = ["| key | flag | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{prefix}{key.name}` | {f'`{key.flag}`' if key.flag else ''} | "
             f"`{_cell(_default(key))}` | {_cell(key.comment)} |" for key in keys]
    return "\n".join(rows) + "\n"


def reference_markdown() -> str:
    """Every section's keys, then each registered scheme's table, as Markdown."""
    registry = current()
    parts = []
    for section, keys in registry.sections.items():
        shared = [key for key in keys.values() if not key.table]
        parts.append(f"### [{section}]\n\n{_table(shared, '')}")
        if section != "exchange":
            continue
        for table, kind in registry.tables.items():
            owners = ", ".join(name for name, scheme in registered().items()
                               if scheme.settings is kind)
            knobs = [key for key in keys.values() if key.table == table]
            parts.append(f"### [exchange.{table}]\n\nThe knobs of scheme {owners}. Each is "
                         f"also the key `exchange.NAME` directly in `[exchange]` (and "
                         f"`--set exchange.NAME=...`), the form results record.\n\n"
                         f"{_table(knobs, '')}")
    return "\n".join(parts)
