"""Suite-wide rule: a skipped test is a failure.

The suite runs on a clone with everything scripts/bootstrap installs (the test
models, the C++ server, chromium, llama.cpp's templates and server README in
tests/data/llama.cpp), in CI and on a user's machine alike, so a missing model,
package, browser or file is a broken setup that must not pass as green. Any skip
(or xfail) makes the run exit 1 and is listed at the end of the report.
"""

from __future__ import annotations

from collections import Counter

import pytest

_unexpected: Counter[str] = Counter()


def _reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _unexpected[_reason(report)] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unexpected:
        terminalreporter.section("skips that count as failures")
        for reason, n in _unexpected.most_common():
            terminalreporter.write_line(f"{n} x {reason}")
