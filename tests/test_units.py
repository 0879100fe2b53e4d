"""akocore.units: human quantities in, exact SI numbers out; clear errors; human text out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akocore.units import (
    UnitError,
    bandwidth_exact_text,
    duration_exact_text,
    format_bandwidth,
    format_duration,
    format_size,
    parse_bandwidth,
    parse_bandwidth_list,
    parse_duration,
    parse_duration_list,
    parse_size,
)

# --------------------------------------------------------------------------- bandwidth


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("40mbps", 40e6),
        ("40Mbps", 40e6),
        ("40 Mbps", 40e6),
        ("1gbps", 1e9),
        ("1Gbps", 1e9),
        ("800Mbit/s", 800e6),
        ("1.5gbit", 1.5e9),
        ("100kbps", 100e3),
        ("100Kbps", 100e3),
        ("2tbps", 2e12),
        ("2.5e9bps", 2.5e9),
        ("7b/s", 7.0),
        ("3bits/s", 3.0),
        ("10MB/s", 80e6),
        ("10MBps", 80e6),
        ("10Mbyte/s", 80e6),
        ("10 MB/s", 80e6),
        ("4MiB/s", 4 * 2**20 * 8),
        ("1Gibps", 2**30),
        ("1KiB/s", 1024 * 8),
        ("1Tibit/s", 2**40),
        ("0.1gbps", 1e8),
        ("  40mbps  ", 40e6),
        ("1000", 1000.0),
        ("1e9", 1e9),
        (1e9, 1e9),
        (1000, 1000.0),
    ],
)
def test_parse_bandwidth_accepts_each_form_exactly(text: str | float, bps: float) -> None:
    assert parse_bandwidth(text) == bps


def test_lowercase_b_is_bits_uppercase_b_is_bytes() -> None:
    assert parse_bandwidth("8MBps") == 8 * parse_bandwidth("8Mbps")
    assert parse_bandwidth("8MB/s") == 8 * parse_bandwidth("8Mb/s")


def test_m_means_mega_never_milli() -> None:
    assert parse_bandwidth("1mbps") == 1e6
    assert parse_bandwidth("1mbps") == parse_bandwidth("1Mbps")


def test_si_and_binary_prefixes_differ() -> None:
    assert parse_bandwidth("1MB/s") == 8_000_000
    assert parse_bandwidth("1MiB/s") == 8_388_608
    assert parse_bandwidth("1kbps") == 1000
    assert parse_bandwidth("1kibps") == 1024


def test_parse_bandwidth_returns_float() -> None:
    assert isinstance(parse_bandwidth(1000), float)


@pytest.mark.parametrize(
    "text",
    ["40 furlongs", "40mbpss", "10MB", "1.5gb", "mbps", "", "   ", "-5mbps", "nan", "inf",
     "nanmbps", "-inf", "0mbps", "0", 0, -1.0, math.nan, math.inf, "1e999bps", "4 0mbps"],
)
def test_parse_bandwidth_rejects(text: str | float) -> None:
    with pytest.raises(UnitError):
        parse_bandwidth(text)


def test_bandwidth_error_quotes_text_and_lists_accepted_forms() -> None:
    with pytest.raises(UnitError) as info:
        parse_bandwidth("40 furlongs")
    message = str(info.value)
    assert message.startswith("cannot read bandwidth '40 furlongs': expected")
    for form in ("40mbps", "1gbps", "800Mbit/s", "10MB/s", "bit/s", "B/s", "Ki Mi Gi Ti"):
        assert form in message


@pytest.mark.parametrize(
    ("text", "reason"),
    [("-5mbps", "negative"), ("", "empty"), ("nan", "finite"), ("0mbps", "greater than zero")],
)
def test_bandwidth_error_says_why_and_still_lists_forms(text: str, reason: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_bandwidth(text)
    message = str(info.value)
    assert repr(text) in message
    assert reason in message
    assert "40mbps" in message


def test_unit_error_is_a_value_error() -> None:
    assert issubclass(UnitError, ValueError)


def test_bool_is_not_a_bandwidth() -> None:
    with pytest.raises(UnitError):
        parse_bandwidth(True)


# --------------------------------------------------------------------------- duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5ms", 0.005),
        ("0.3s", 0.3),
        ("2m", 120.0),
        ("2min", 120.0),
        ("2 minutes", 120.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("100us", 1e-4),
        ("250µs", 250e-6),  # micro sign
        ("250μs", 250e-6),  # greek mu
        ("20ns", 20e-9),
        ("1.5", 1.5),
        ("300", 300.0),
        ("300s", 300.0),
        ("3sec", 3.0),
        ("0", 0.0),
        ("0ms", 0.0),
        (1.5, 1.5),
        (0, 0.0),
    ],
)
def test_parse_duration_accepts_each_form(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 parsecs", "", "-1s", "nan", "infs", "5mss", "s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_duration(text)
    message = str(info.value)
    assert f"cannot read duration {text!r}" in message
    assert "5ms" in message and "1h" in message


# --------------------------------------------------------------------------- size


@pytest.mark.parametrize(
    ("text", "size_bytes"),
    [
        ("17MB", 17_000_000),
        ("17 MB", 17_000_000),
        ("4MiB", 4 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("512KiB", 512 * 1024),
        ("2kB", 2000),
        ("2KB", 2000),
        ("100B", 100),
        ("100bytes", 100),
        ("100", 100),
        (100, 100),
        ("8bit", 1),
        ("8Mbit", 1_000_000),
        ("1Mibit", 2**20 // 8),
        ("0", 0),
        ("0B", 0),
    ],
)
def test_parse_size_accepts_each_form(text: str | int, size_bytes: int) -> None:
    result = parse_size(text)
    assert result == size_bytes
    assert isinstance(result, int)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1bit", "whole number"),
        ("12bit", "whole number"),
        ("1.5B", "whole number"),
        ("17mb", "ambiguous"),
        ("17 furlongs", ""),
        ("-1MB", "negative"),
        ("", "empty"),
        ("nan", "finite"),
    ],
)
def test_parse_size_rejects(text: str, reason: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_size(text)
    message = str(info.value)
    assert f"cannot read size {text!r}" in message
    assert reason in message
    assert "17MB" in message and "4MiB" in message


# --------------------------------------------------------------------------- lists


def test_trailing_unit_applies_to_unitless_items_before_it() -> None:
    assert parse_bandwidth_list("40,20,10mbps") == (40e6, 20e6, 10e6)
    assert parse_bandwidth_list("40, 20, 10 Mbps") == (40e6, 20e6, 10e6)
    assert parse_duration_list("1,5,10ms") == (0.001, 0.005, 0.01)


def test_each_item_may_carry_its_own_unit() -> None:
    assert parse_bandwidth_list("800mbps,400mbps") == (800e6, 400e6)
    assert parse_bandwidth_list("1gbps,100,10MB/s") == (1e9, 800e6, 80e6)
    assert parse_duration_list("5ms,1s") == (0.005, 1.0)


def test_single_value_and_sequences_are_lists_too() -> None:
    assert parse_bandwidth_list("40mbps") == (40e6,)
    assert parse_bandwidth_list(1e9) == (1e9,)
    assert parse_bandwidth_list(["800mbps", 4e8]) == (800e6, 400e6)
    assert parse_duration_list("5ms") == (0.005,)
    assert parse_duration_list([0, "5ms"]) == (0.0, 0.005)


def test_unitless_list_is_base_units() -> None:
    assert parse_bandwidth_list("40,20") == (40.0, 20.0)
    assert parse_duration_list("1,2") == (1.0, 2.0)


@pytest.mark.parametrize("text", ["40mbps,20", "", "40,,10mbps", "40mbps,furlongs", []])
def test_bad_lists_are_rejected(text: str) -> None:
    with pytest.raises(UnitError):
        parse_bandwidth_list(text)


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("bps", "text"),
    [
        (40e6, "40 Mbit/s"),
        (1e9, "1 Gbit/s"),
        (1.5e9, "1.5 Gbit/s"),
        (800e6, "800 Mbit/s"),
        (100e3, "100 kbit/s"),
        (5, "5 bit/s"),
        (999_999_999, "1 Gbit/s"),
        (math.inf, "inf bit/s"),
    ],
)
def test_format_bandwidth(bps: float, text: str) -> None:
    assert format_bandwidth(bps) == text


@pytest.mark.parametrize(
    ("size_bytes", "text"),
    [(17_050_000, "17.05 MB"), (100, "100 B"), (0, "0 B"), (1_500_000_000, "1.5 GB"),
     (2048, "2.048 kB")],
)
def test_format_size(size_bytes: int, text: str) -> None:
    assert format_size(size_bytes) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.305, "305 ms"),
        (3.41, "3.41 s"),
        (150.0, "2.5 min"),
        (7200.0, "2 h"),
        (250e-6, "250 µs"),
        (20e-9, "20 ns"),
        (0.0, "0 s"),
        (0.9999999, "1 s"),
        (59.9999, "1 min"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_human_formats_parse_back_close() -> None:
    assert parse_bandwidth(format_bandwidth(40e6)) == 40e6
    assert parse_duration(format_duration(0.305)) == pytest.approx(0.305)
    assert parse_size(format_size(17_050_000)) == 17_050_000


# --------------------------------------------------------------------------- exact text


@pytest.mark.parametrize(
    ("bps", "text"),
    [(40e6, "40Mbps"), (1e9, "1Gbps"), (1.5e9, "1.5Gbps"), (500e3, "500kbps"), (7.0, "7bps")],
)
def test_bandwidth_exact_text_is_short(bps: float, text: str) -> None:
    assert bandwidth_exact_text(bps) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.005, "5ms"), (3600.0, "1h"), (1.5, "1.5s"), (0.0, "0s"), (100e-6, "100us")],
)
def test_duration_exact_text_is_short(seconds: float, text: str) -> None:
    assert duration_exact_text(seconds) == text


@given(st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_bandwidth_exact_text_round_trips(bps: float) -> None:
    assert parse_bandwidth(bandwidth_exact_text(bps)) == bps


@given(st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_duration_exact_text_round_trips(seconds: float) -> None:
    assert parse_duration(duration_exact_text(seconds)) == seconds


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["k", "M", "G", "Ki", "Mi"]))
def test_bytes_are_eight_bits(number: int, prefix: str) -> None:
    assert parse_bandwidth(f"{number + 1}{prefix}B/s") == 8 * parse_bandwidth(
        f"{number + 1}{prefix}bps"
    )
    assert parse_size(f"{number}{prefix}B") * 8 == parse_size(f"{8 * number}{prefix}bit") * 8
