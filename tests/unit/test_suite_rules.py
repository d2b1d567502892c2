"""The suite's own rules: any skip or xfail fails the run (tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text("import pytest\n\n" + body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unexplained_skip_fails_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path, "def test_a():\n    pytest.skip('the model is not installed')\n\ndef test_b():\n    pass\n")
    assert run.returncode == 1, run.stdout
    assert "1 x the model is not installed" in run.stdout


def test_an_xfail_fails_the_run_too(tmp_path: Path) -> None:
    run = _run(tmp_path, "@pytest.mark.xfail(reason='flaky')\ndef test_a():\n    assert False\n")
    assert run.returncode == 1, run.stdout
    assert "xfail: flaky" in run.stdout


def test_no_reason_is_allowed_not_even_the_one_that_was(tmp_path: Path) -> None:
    # A missing template corpus was once excused; bootstrap now puts it in tests/data/llama.cpp.
    body = "@pytest.mark.skipif(True, reason='chat-template corpus not found')\ndef test_a():\n    pass\n"
    run = _run(tmp_path, body)
    assert run.returncode == 1, run.stdout
    assert "1 x chat-template corpus not found" in run.stdout


def test_a_run_without_skips_passes(tmp_path: Path) -> None:
    run = _run(tmp_path, "def test_a():\n    pass\n")
    assert run.returncode == 0, run.stdout
