"""The README speaks to users: no commit hashes, issue numbers or development history (that is CHANGELOG.md),
and no picture that breaks on the package index (only absolute image URLs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# A run of 7-40 hex digits with at least one digit and one letter: a commit hash, not a word or a number.
_HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
_ISSUE = re.compile(r"\b(?:issues?|items?|PR|pull request)\s*#?\d+|(?<![\w&])#\d+\b|\bclasses \d+-\d+", re.I)
_HISTORY = re.compile(r"\bthis round\b|\bprevious run\b|\bused to\b|\bround two\b|\b20\d\d-\d\d-\d\d\b", re.I)


def test_no_commit_hashes():
    assert _HASH.findall(README) == []


def test_no_issue_numbers():
    assert [m.group(0) for m in _ISSUE.finditer(README)] == []


def test_no_history():
    assert [m.group(0) for m in _HISTORY.finditer(README)] == []


def test_images_use_absolute_urls():
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)", README) + re.findall(r"<img[^>]+src=[\"']([^\"']+)", README)
    assert [url for url in images if not url.startswith("https://")] == []


def test_the_checks_catch_what_they_are_for():
    assert _HASH.findall("regenerated at d9fc302 and 244bea6") == ["d9fc302", "244bea6"]
    assert not _HASH.findall("decade 1234567 deadbeef abcdefab file.0a1b2c3d")
    assert [m.group(0) for m in _ISSUE.finditer("issue 17's targets; issue 14, classes 5-7; see #12")] == [
        "issue 17", "issue 14", "classes 5-7", "#12"]
    assert _HISTORY.search("the custom checks (this round)")


def test_changelog_keeps_the_history():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert changelog.startswith("# Changelog\n") and "## [Unreleased]" in changelog
    assert "keepachangelog.com" in changelog
