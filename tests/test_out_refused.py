"""An --out that cannot be written is refused before any work starts, in every command.

`akorun launch`, `akosim` (plan), `akosim train` and `akosim sweep` each exit 2
with one line naming the flag, and have done nothing yet (no table, no rank
started). Tests run as root, where permission bits stop nothing: the unwritable
places are a path under a regular file and a path in /proc.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from akorun.testing import REPO_ROOT, akorun_command, child_test_env
from akosim.cli import main as akosim_main

pytestmark = pytest.mark.timeout(120)

SMALL = ["--workers", "4", "--gradient-size", "400KB", "--compute", "50ms", "--rounds", "12",
         "--quiet"]


@pytest.fixture(params=["under-a-file", "in-proc"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """A place no --out can be written, and the reason the line gives."""
    if request.param == "in-proc":
        if not Path("/proc/self").is_dir():
            pytest.skip("needs /proc (Linux)")
        return Path("/proc/ako-no-such-place/out"), "cannot write there"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    return blocker / "out", f"cannot write there ({blocker} is a file, not a directory)"


def _akosim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = akosim_main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_akorun_launch_refuses_an_unwritable_out_before_starting_a_rank(
        unwritable: tuple[Path, str]) -> None:
    out, reason = unwritable
    result = subprocess.run(akorun_command("launch", "--workers", "2", "--rounds", "2",
                                           "--out", str(out)),
                            capture_output=True, text=True, env=child_test_env(),
                            cwd=REPO_ROOT, timeout=60)
    _one_line(result.returncode, result.stderr, f"--out {out}", reason)
    assert result.stderr.startswith("akorun launch: error: ")


@pytest.mark.parametrize("command", [[], ["plan"], ["train"]], ids=["default", "plan", "train"])
def test_akosim_plan_and_train_refuse_an_unwritable_out_before_planning(
        capsys: pytest.CaptureFixture[str], unwritable: tuple[Path, str],
        command: list[str]) -> None:
    target, reason = unwritable
    out = target / "result.json"
    code, stdout, err = _akosim(capsys, *command, *SMALL, "--out", str(out))
    _one_line(code, err, f"--out {out}", reason)
    assert stdout == ""  # nothing planned, nothing trained


def test_akosim_refuses_a_directory_as_out_file_and_an_unwritable_trace(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        unwritable: tuple[Path, str]) -> None:
    code, stdout, err = _akosim(capsys, *SMALL, "--out", str(tmp_path))
    _one_line(code, err, f"--out {tmp_path}: is a directory")
    assert stdout == ""
    target, reason = unwritable
    code, stdout, err = _akosim(capsys, *SMALL, "--trace", str(target / "t.json"))
    _one_line(code, err, "--trace", reason)
    assert stdout == ""


def test_akosim_sweep_refuses_an_unwritable_out_before_running_a_point(
        capsys: pytest.CaptureFixture[str], unwritable: tuple[Path, str]) -> None:
    out, reason = unwritable
    code, stdout, err = _akosim(capsys, "sweep", *SMALL, "--p", "1,2", "--out", str(out))
    _one_line(code, err, f"--out {out}", reason)
    assert stdout == ""  # not even the plan of the sweep's points
