"""Every command and Python snippet in docs/*.md runs as written in a fresh checkout (the runner and
its rules: tests/test_readme.py)."""

from __future__ import annotations

import pytest
from test_readme import ROOT, run_page

DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_runs_as_written(page, tmp_path):
    ran, skipped = run_page(page, tmp_path)
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
