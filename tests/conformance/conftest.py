"""Print every statistical arm's numbers at the end of the session, not only PASS/FAIL."""

from tests.conformance.harness import REPORTS


def pytest_terminal_summary(terminalreporter):
    if REPORTS:
        terminalreporter.section("conformance arms: measured values")
        for line in REPORTS:
            terminalreporter.write_line(line)
