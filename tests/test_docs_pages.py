"""Every command and Python snippet in docs/*.md runs as written in a fresh checkout (the runner and
its rules: tests/test_readme.py)."""

from __future__ import annotations

import pytest
from test_readme import ROOT, _skip_reason, check_gains, run_page, units

# the pages with commands or snippets (design.md and the like hold prose and tables only)
DOCS = [p for p in sorted((ROOT / "docs").glob("*.md")) if units(p.read_text())]


def test_every_page_with_code_has_code_that_runs():
    """A page is tested only by what runs: a skip rule that covered every block of a page would leave
    its test passing on nothing."""
    assert DOCS
    for page in DOCS:
        runnable = [code for _, _, code in units(page.read_text()) if not _skip_reason(code)]
        assert runnable, f"{page.name}: every command and snippet is skipped"


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_runs_as_written(page, tmp_path):
    outputs: dict[str, str] = {}
    ran, skipped = run_page(page, tmp_path, outputs)
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
    print("gains:", *check_gains(page, outputs), sep="\n  ")
    assert ran, f"{page.name}: nothing ran (skipped: {skipped})"


def test_no_page_holds_a_placeholder():
    """A line that is only an upper-case token (``RESULTS``, ``MEMORY_TABLE``) is a table someone meant to
    fill in from a measurement: a reader would see the token instead of the figures."""
    import re

    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not re.fullmatch(r"[A-Z][A-Z0-9_]{3,}", line.strip()), f"{page.name}:{n}: placeholder {line!r}"
