"""scripts/need_disk.sh: the Makefile's check before each venv install (docs/testing.md)."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "need_disk.sh"


def run(need: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), need, "a test venv"], cwd=tmp_path, capture_output=True, text=True)


def test_enough_space_passes_in_silence(tmp_path: Path) -> None:
    done = run("0", tmp_path)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


def test_too_little_space_stops_with_what_is_needed_and_free(tmp_path: Path) -> None:
    done = run("1000000", tmp_path)  # a million GiB: more than any machine this runs on
    assert done.returncode == 1
    assert "a test venv needs about 1000000 GiB free on " in done.stderr
    assert " GiB is;" in done.stderr
