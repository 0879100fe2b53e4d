"""Human units at the edges, SI numbers inside.

This module owns reading and writing the quantities a user types or reads:

* bandwidth -> bits per second (float): ``40mbps``, ``1gbps``, ``800Mbit/s``,
  ``1.5gbit``, ``10MB/s``, ``4MiB/s``, ``2.5e9bps``, a bare number (bits/s);
* duration -> seconds (float): ``5ms``, ``0.3s``, ``2m`` (minutes), ``1h``,
  ``100us``, ``250µs``, a bare number (seconds);
* size -> bytes (int): ``17MB``, ``4MiB``, ``512KiB``, ``100B``, ``8Mbit``,
  a bare number (bytes).

Rules, chosen once and used everywhere:

* Prefixes ``k M G T`` are SI (powers of 1000) and case-insensitive, so
  ``m`` means mega, never milli (nobody has a millibit link). ``Ki Mi Gi Ti``
  are binary (powers of 1024).
* The letter ``b`` decides bits against bytes and is case-sensitive:
  lowercase ``b`` is bits, uppercase ``B`` is bytes (x8). So ``40mbps`` and
  ``40Mbps`` are 40 megabits per second while ``40MBps`` and ``40MB/s`` are
  40 megabytes per second (320 Mbit/s). The spelled-out words ``bit`` and
  ``byte`` are unambiguous and case-insensitive.
* For sizes a lone lowercase ``b`` (``17mb``) is refused as ambiguous: write
  ``17MB`` for bytes or ``17Mbit`` for bits.
* Numbers are read exactly (as fractions) and rounded to float once, so
  ``parse_bandwidth("10MB/s") == 80e6`` and ``parse_duration("5ms") == 0.005``.

Every reading error is a `UnitError` that quotes the text it was given and
lists the accepted forms. At the user's edges (flags, config files) a bare
number is refused, because ``--bandwidth 40`` (40 bit/s) or ``--latency 20``
(20 s) is never what was meant: `bare_number` finds one and
`refuse_bare_number` says how to write it ("--bandwidth 40: add a unit, e.g.
40mbps"); zero needs no unit. The parse functions themselves still read bare
numbers (SI) for code that passes typed values. The ``format_*`` functions give short human text
(``"40 Mbit/s"``, ``"17.05 MB"``, ``"305 ms"``); the ``*_exact_text``
functions give short text that parses back to exactly the same number (used
to echo a resolved configuration).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction

__all__ = [
    "UnitError",
    "bandwidth_exact_text",
    "bare_number",
    "duration_exact_text",
    "format_bandwidth",
    "format_duration",
    "format_size",
    "parse_bandwidth",
    "parse_bandwidth_list",
    "parse_duration",
    "parse_duration_list",
    "parse_size",
    "refuse_bare_number",
]


class UnitError(ValueError):
    """A quantity could not be read; the message says what was expected."""


Number = int | float
Quantity = str | int | float

BANDWIDTH_FORMS = (
    "a number and a unit such as 40mbps, 1gbps, 800Mbit/s, 10MB/s "
    "(bits: bps, bit/s; bytes: B/s, Bps; prefixes k M G T or Ki Mi Gi Ti)"
)
DURATION_FORMS = (
    "a number and a unit such as 5ms, 0.3s, 2m, 1h, 100us "
    "(units: ns, us or µs, ms, s, m or min, h; a bare number is seconds)"
)
SIZE_FORMS = (
    "a whole number of bytes with a unit such as 17MB, 4MiB, 1.5GB, 512KiB, 100B, 8Mbit "
    "(bytes: B; bits: bit; prefixes k M G T or Ki Mi Gi Ti; a bare number is bytes)"
)

_NUMBER_RE = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?)\s*(?P<unit>.*?)$",
    re.DOTALL,
)
_NON_FINITE_RE = re.compile(r"^[+-]?(?:nan|inf(?:inity)?)", re.IGNORECASE)
_PREFIX_RE = re.compile(r"^(?P<letter>[kmgt])(?P<binary>i?)(?P<rest>.+)$", re.IGNORECASE)

_SI_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}

_DURATION_UNITS: dict[str, Fraction] = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),  # micro sign U+00B5
    "μs": Fraction(1, 10**6),  # greek small mu U+03BC
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "sec": Fraction(1),
    "secs": Fraction(1),
    "second": Fraction(1),
    "seconds": Fraction(1),
    "m": Fraction(60),
    "min": Fraction(60),
    "mins": Fraction(60),
    "minute": Fraction(60),
    "minutes": Fraction(60),
    "h": Fraction(3600),
    "hr": Fraction(3600),
    "hrs": Fraction(3600),
    "hour": Fraction(3600),
    "hours": Fraction(3600),
}


def _show(text: object) -> str:
    """Quote what the user gave, as it will appear in an error message."""
    return repr(text) if isinstance(text, str) else f"'{text!r}'"


def _fail(kind: str, text: object, forms: str, reason: str = "") -> UnitError:
    lead = f"{reason}; " if reason else ""
    return UnitError(f"cannot read {kind} {_show(text)}: {lead}expected {forms}")


def _split(kind: str, text: Quantity, forms: str) -> tuple[Fraction, str]:
    """Read `text` into an exact non-negative number and its (stripped) unit text."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise _fail(kind, text, forms, f"got a {type(text).__name__}")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise _fail(kind, text, forms, "the value is not a finite number")
        if text < 0:
            raise _fail(kind, text, forms, f"a {kind} cannot be negative")
        return Fraction(text), ""
    stripped = text.strip()
    if not stripped:
        raise _fail(kind, text, forms, "the text is empty")
    if _NON_FINITE_RE.match(stripped):
        raise _fail(kind, text, forms, "the value is not a finite number")
    match = _NUMBER_RE.match(stripped)
    if match is None:
        raise _fail(kind, text, forms)
    number = Fraction(match["number"])
    if number < 0:
        raise _fail(kind, text, forms, f"a {kind} cannot be negative")
    return number, match["unit"].strip()


def _to_float(kind: str, text: object, forms: str, value: Fraction) -> float:
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise _fail(kind, text, forms, "the value is too large")
    return result


def _prefix_multiplier(unit: str) -> tuple[int, str]:
    """Split an SI or binary prefix off `unit`: ("Mibps") -> (1024**2, "bps")."""
    match = _PREFIX_RE.match(unit)
    if match is None:
        return 1, unit
    power = _SI_POWER[match["letter"].lower()]
    base = 1024 if match["binary"] else 1000
    return base**power, match["rest"]


def _bandwidth_bits_per_unit(unit: str) -> int | None:
    """Bits per second in one `unit` (e.g. "MB/s" -> 8_000_000), None if unknown."""
    if unit == "":
        return 1
    multiplier, base = _prefix_multiplier(unit)
    lowered = base.lower()
    stem, per_second = base, False
    for suffix in ("/s", "/sec", "ps"):
        if lowered.endswith(suffix) and len(base) > len(suffix):
            stem, per_second = base[: -len(suffix)], True
            break
    stem_lower = stem.lower()
    if stem_lower in ("bit", "bits"):
        return multiplier
    if not per_second:
        return None  # "10MB" is a size, "1.5gb" is ambiguous: ask for a rate
    if stem == "b":
        return multiplier
    if stem == "B" or stem_lower in ("byte", "bytes"):
        return multiplier * 8
    return None


def parse_bandwidth(text: Quantity) -> float:
    """Read a bandwidth such as "40mbps", "10MB/s" or 1e9 into bits per second.

    Lowercase b is bits, uppercase B is bytes; k M G T are powers of 1000 and
    Ki Mi Gi Ti powers of 1024. A bare number is bits per second. Zero is an
    error (a link with no capacity never delivers anything).
    """
    number, unit = _split("bandwidth", text, BANDWIDTH_FORMS)
    bits = _bandwidth_bits_per_unit(unit)
    if bits is None:
        raise _fail("bandwidth", text, BANDWIDTH_FORMS)
    if number == 0:
        raise _fail("bandwidth", text, BANDWIDTH_FORMS, "a bandwidth must be greater than zero")
    return _to_float("bandwidth", text, BANDWIDTH_FORMS, number * bits)


def parse_duration(text: Quantity) -> float:
    """Read a duration such as "5ms", "2m" (minutes) or 1.5 into seconds; zero is allowed."""
    number, unit = _split("duration", text, DURATION_FORMS)
    seconds = Fraction(1) if unit == "" else _DURATION_UNITS.get(unit.lower())
    if seconds is None:
        raise _fail("duration", text, DURATION_FORMS)
    return _to_float("duration", text, DURATION_FORMS, number * seconds)


def parse_size(text: Quantity) -> int:
    """Read a size such as "17MB", "4MiB", "8Mbit" or 100 into a whole number of bytes.

    Zero is allowed. Bits are divided by 8 and must come to whole bytes.
    """
    number, unit = _split("size", text, SIZE_FORMS)
    multiplier, base = _prefix_multiplier(unit) if unit else (1, "")
    base_lower = base.lower()
    if base == "" and unit == "":
        exact = number
    elif base == "B" or base_lower in ("byte", "bytes"):
        exact = number * multiplier
    elif base_lower in ("bit", "bits"):
        exact = number * multiplier / 8
    elif base == "b":
        raise _fail(
            "size", text, SIZE_FORMS, "a lowercase b is ambiguous for a size (write B or bit)"
        )
    else:
        raise _fail("size", text, SIZE_FORMS)
    if exact.denominator != 1:
        raise _fail("size", text, SIZE_FORMS, f"{float(exact):g} bytes is not a whole number")
    return int(exact)


def _split_list(kind: str, text: Quantity | Sequence[Quantity]) -> list[Quantity]:
    """Items of a list quantity, unit-less text items taking the next unit to their right."""
    if isinstance(text, str):
        raw: list[Quantity] = [item.strip() for item in text.split(",")]
    elif isinstance(text, int | float):
        raw = [text]
    else:
        raw = list(text)
    if not raw:
        raise UnitError(f"cannot read {kind} list {_show(text)}: the list is empty")
    units: list[str | None] = []
    for item in raw:
        if isinstance(item, str):
            if not item.strip():
                raise UnitError(
                    f"cannot read {kind} list {_show(text)}: it has an empty item; "
                    f"write comma-separated values such as 40,20,10mbps"
                )
            match = _NUMBER_RE.match(item.strip())
            units.append(match["unit"].strip() if match else None)
        else:
            units.append(None)
    if not any(units):
        return raw
    items: list[Quantity] = []
    for index, item in enumerate(raw):
        if isinstance(item, str) and units[index] == "":
            later = next((u for u in units[index + 1 :] if u), None)
            if later is None:
                raise UnitError(
                    f"cannot read {kind} list {_show(text)}: item {item!r} has no unit and "
                    f"no item after it gives one; put the unit on the last item (40,20,10mbps) "
                    f"or on every item"
                )
            item = item.strip() + later
        items.append(item)
    return items


def _is_bare(item: object) -> bool:
    """A number without a unit (int/float, or text that is only a number), zero excepted."""
    if isinstance(item, bool):
        return False
    if isinstance(item, int | float):
        return item != 0 and math.isfinite(item)
    if isinstance(item, str):
        match = _NUMBER_RE.match(item.strip())
        return match is not None and match["unit"].strip() == "" and \
            Fraction(match["number"]) != 0
    return False


def bare_number(value: object) -> bool:
    """True when `value` (a quantity, a comma list or a sequence) gives a number without
    a unit: 40, "40", "40,20", [40, "20mbps"]. In a comma list only the last item needs
    one ("40,20,10mbps"); zero needs none; nested lists (matrices) are searched."""
    if isinstance(value, str):
        items = [item for item in value.split(",") if item.strip()]
        return bool(items) and all(_is_bare(item) or _is_zero(item) for item in items) and \
            any(_is_bare(item) for item in items)
    if isinstance(value, list | tuple):
        return any(bare_number(item) for item in value)
    return _is_bare(value)


def _is_zero(item: str) -> bool:
    match = _NUMBER_RE.match(item.strip())
    return match is not None and match["unit"].strip() == "" and \
        Fraction(match["number"]) == 0


def refuse_bare_number(where: str, value: object, unit: str) -> None:
    """UnitError "WHERE: add a unit, e.g. 40mbps" when `value` is a bare number;
    `where` says who gave it ("--bandwidth 40"), `unit` is the example's unit."""
    if not bare_number(value):
        return
    first = re.search(r"\d+(?:\.\d+)?", str(value))
    example = f"{first.group(0) if first else 1}{unit}"
    raise UnitError(f"{where}: add a unit, e.g. {example}")


def parse_bandwidth_list(text: Quantity | Sequence[Quantity]) -> tuple[float, ...]:
    """Read "40,20,10mbps", "800mbps,400mbps", a single value or a sequence into bits/s.

    A unit-less item takes the unit of the next item to its right that has
    one, so "40,20,10mbps" is 40, 20 and 10 Mbit/s. All items unit-less means
    bits per second.
    """
    return tuple(parse_bandwidth(item) for item in _split_list("bandwidth", text))


def parse_duration_list(text: Quantity | Sequence[Quantity]) -> tuple[float, ...]:
    """Read "1,5,10ms", "5ms,1s", a single value or a sequence into seconds.

    Unit-less items take the next unit to their right, as in parse_bandwidth_list.
    """
    return tuple(parse_duration(item) for item in _split_list("duration", text))


# ---------------------------------------------------------------------------
# Human output


def _format_scaled(value: float, units: Sequence[tuple[float, str]]) -> str:
    """`value` in the largest of `units` (ascending factors) it reaches, 4 significant digits."""
    if math.isnan(value):
        return f"nan {units[0][1]}"
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}inf {units[0][1]}"
    magnitude = abs(value)
    index = next((i for i, (factor, _) in enumerate(units) if factor == 1), 0)
    if magnitude > 0:
        index = 0
        for i, (factor, _) in enumerate(units):
            if magnitude >= factor:
                index = i
    while True:
        factor, name = units[index]
        scaled = magnitude / factor
        digits = f"{scaled:.4g}" if scaled < 1000 or index + 1 < len(units) else f"{scaled:.0f}"
        has_next = index + 1 < len(units)
        if has_next and float(digits) * factor >= units[index + 1][0]:
            index += 1  # rounding reached the next unit: 999.99 ms -> 1 s
            continue
        sign = "-" if value < 0 and float(digits) != 0 else ""
        return f"{sign}{digits} {name}"


def format_bandwidth(bps: float) -> str:
    """Human text for bits per second: 40e6 -> "40 Mbit/s"."""
    return _format_scaled(
        bps,
        [(1, "bit/s"), (1e3, "kbit/s"), (1e6, "Mbit/s"), (1e9, "Gbit/s"), (1e12, "Tbit/s")],
    )


def format_size(size_bytes: float) -> str:
    """Human text for bytes, SI: 17_050_000 -> "17.05 MB"."""
    return _format_scaled(
        size_bytes,
        [(1, "B"), (1e3, "kB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB"), (1e15, "PB")],
    )


def format_duration(seconds: float) -> str:
    """Human text for seconds: 0.305 -> "305 ms", 3.41 -> "3.41 s", 150 -> "2.5 min"."""
    return _format_scaled(
        seconds,
        [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1, "s"), (60, "min"), (3600, "h")],
    )


# ---------------------------------------------------------------------------
# Exact text (parses back to the identical float)


def _exact_text(
    value: float,
    units: Sequence[tuple[Fraction, str]],
    parse: Callable[[str], float],
) -> str:
    """Shortest "<number><unit>" over `units` that `parse` reads back as exactly `value`.

    Shortest number wins, then a whole number, then the earlier unit. The
    first unit must have factor 1 (a plain repr always reads back exactly).
    """
    best: str | None = None
    best_key: tuple[int, bool] | None = None
    for factor, name in units:
        number = float(Fraction(value) / factor)
        digits = repr(number)
        if digits.endswith(".0"):
            digits = digits[:-2]
        candidate = digits + name
        try:
            if parse(candidate) != value:
                continue
        except UnitError:
            continue
        key = (len(digits), not digits.isdigit())  # shortest, then whole numbers
        if best_key is None or key < best_key:
            best, best_key = candidate, key
    if best is None:  # unreachable for finite non-negative input, kept as a guard
        return repr(value)
    return best


def bandwidth_exact_text(bps: float) -> str:
    """Short text that parse_bandwidth reads back exactly: 40e6 -> "40Mbps"."""
    if not (math.isfinite(bps) and bps > 0):
        raise UnitError(f"bandwidth_exact_text needs a finite positive number, got {bps!r}")
    units = [
        (Fraction(1), "bps"),
        (Fraction(10**3), "kbps"),
        (Fraction(10**6), "Mbps"),
        (Fraction(10**9), "Gbps"),
        (Fraction(10**12), "Tbps"),
    ]
    return _exact_text(bps, units, parse_bandwidth)


def duration_exact_text(seconds: float) -> str:
    """Short text that parse_duration reads back exactly: 0.005 -> "5ms", 3600 -> "1h"."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise UnitError(f"duration_exact_text needs a finite non-negative number, got {seconds!r}")
    units = [
        (Fraction(1), "s"),
        (Fraction(1, 1000), "ms"),
        (Fraction(1, 10**6), "us"),
        (Fraction(1, 10**9), "ns"),
        (Fraction(60), "min"),
        (Fraction(3600), "h"),
    ]
    return _exact_text(seconds, units, parse_duration)
