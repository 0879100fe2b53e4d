"""Flags are taken only whole, in akosim and akorun, and a near miss gets a suggestion."""

from __future__ import annotations

import pytest

from akocore.cli_support import OneLineParser, did_you_mean
from akorun.launching.commands import main as akorun_main
from akosim.cli import main as akosim_main


def _refused(capsys: pytest.CaptureFixture[str], main, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv", [["launch", "--worker", "8", "--out", "x"],
                                  ["worker", "--worker", "8"],
                                  ["init", "--worker", "8", "--out", "x"]])
def test_akorun_refuses_a_flag_prefix_and_names_the_whole_flag(capsys, argv):
    err = _refused(capsys, akorun_main, argv)
    assert "unrecognized arguments: --worker 8" in err
    assert "did you mean --workers?" in err
    assert f"(see akorun {argv[0]} --help)" in err


@pytest.mark.parametrize("argv", [["--worker", "8"], ["plan", "--worker", "8"],
                                  ["sweep", "--worker", "8", "--out", "x"]])
def test_akosim_refuses_a_flag_prefix(capsys, argv):
    err = _refused(capsys, akosim_main, argv)
    assert "unrecognized arguments: --worker 8" in err
    assert "did you mean --workers?" in err


def test_a_misspelt_flag_gets_did_you_mean(capsys):
    err = _refused(capsys, akosim_main, ["--bandwith", "10mbps"])
    assert "did you mean --bandwidth?" in err
    err = _refused(capsys, akorun_main, ["launch", "--bandwith=10mbps", "--out", "x"])
    assert "did you mean --bandwidth?" in err


def test_a_flag_far_from_every_known_one_gets_no_guess(capsys):
    err = _refused(capsys, akosim_main, ["--zzzzzz", "1"])
    assert "unrecognized arguments: --zzzzzz 1" in err
    assert "did you mean" not in err


def test_subparsers_inherit_whole_flags_only():
    parser = OneLineParser(prog="p")
    sub = parser.add_subparsers(dest="command").add_parser("go")
    sub.add_argument("--workers")
    assert parser.allow_abbrev is False and sub.allow_abbrev is False
    assert parser.parse_args(["go", "--workers", "3"]).workers == "3"
    assert not hasattr(parser.parse_args(["go"]), "_one_line_flag_owner")


def test_did_you_mean_skips_positional_values():
    assert did_you_mean(["8", "--wrkers"], ["--workers", "--rounds"]) == \
        "did you mean --workers?"
    assert did_you_mean(["8"], ["--workers"]) == ""
