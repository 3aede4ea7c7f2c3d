"""The documents stand on their own: a reader has no access to our tracker, so a page says
what was found and fixed instead of pointing to an issue number."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# "issue 10", "issues 3 and 4", "issue #7"; another project's issue is cited by its repository.
TRACKER_REFERENCE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_no_document_refers_to_an_issue_number() -> None:
    found = [
        f"{doc.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if TRACKER_REFERENCE.search(line)
    ]
    assert found == []
