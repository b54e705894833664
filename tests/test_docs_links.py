"""Every Markdown link in the repository leads to a file a fresh clone has.

A clone is all a newcomer gets: a link to a folder beside the repository, to an ignored
build output or to a renamed page is dead for them. Web links are not fetched (no network in
tests); `#anchors` into Markdown files must name a heading (GitHub's slugs).
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from urllib.parse import unquote

import pytest

from tests.conftest import ROOT

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# `](target)` ends every inline link and image, nested ones included; a title may follow.
INLINE = re.compile(
    r"\]\(\s*(<[^>\n]*>|(?:[^\s()]|\([^\s()]*\))*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
WEB = ("http:", "https:", "mailto:")


@cache
def repo_files() -> frozenset[str]:
    """What a clone has: tracked files, plus new files git does not ignore (not yet added)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return frozenset(p for p in listed if (ROOT / p).exists())


def markdown_files() -> list[str]:
    return sorted(p for p in repo_files() if p.endswith(".md"))


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (those inside come back empty)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def links(text: str) -> list[str]:
    """Targets of inline links and images and of reference definitions."""
    found = []
    for line in prose_lines(text):
        line = CODE_SPAN.sub("``", line)  # `[a](b)` in code is no link
        found += INLINE.findall(line)
        found += REFERENCE.findall(line)
    return [t[1:-1] if t.startswith("<") else t for t in found]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every `#anchor` a page has: heading slugs (repeats get -1, -2, ...) and HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        if match := HEADING.match(line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def problem(page: str, target: str) -> str | None:
    """Why `target`, linked from the repository file `page`, is dead; None if it is fine."""
    if target.lower().startswith(WEB):
        return None
    if SCHEME.match(target):
        return "a link outside the repository (only http, https and mailto may leave it)"
    path, _, anchor = target.partition("#")
    path = unquote(path.partition("?")[0])
    if path.startswith("/"):
        return "an absolute path: outside a clone, use a path relative to the page"
    resolved = (ROOT / page).parent / path if path else ROOT / page
    try:
        rel = resolved.resolve().relative_to(ROOT.resolve()).as_posix()
    except ValueError:
        return "outside the repository"
    files = repo_files()
    if rel != "." and rel not in files and not any(f.startswith(rel + "/") for f in files):
        return "no such file in the repository"
    if anchor and rel.endswith(".md") and anchor not in anchors((ROOT / rel).read_text()):
        return f"{rel} has no heading for #{anchor}"
    return None


@pytest.mark.parametrize("page", markdown_files())
def test_links_stay_in_the_repository(page: str) -> None:
    dead = [
        f"{target}: {why}"
        for target in links((ROOT / page).read_text())
        if (why := problem(page, target))
    ]
    assert not dead, f"{page} has dead links:\n" + "\n".join(dead)


def test_the_checker_finds_what_it_should() -> None:
    text = (
        "See [spec](../shared/SPEC.md), [ops](docs/operations.md#exit-codes), ![img](a.png),\n"
        '[web](https://example.com "title"), [here](#top), <https://auto.example>.\n'
        "`[code](not/a/link.md)`\n"
        "```\n[fenced](not/a/link.md)\n```\n"
        "[ref]: <deploy/steward.service>\n"
    )
    assert links(text) == [
        "../shared/SPEC.md",
        "docs/operations.md#exit-codes",
        "a.png",
        "https://example.com",
        "#top",
        "deploy/steward.service",
    ]
    assert problem("README.md", "../shared/SPEC.md") == "outside the repository"
    assert problem("README.md", "docs/nope.md") == "no such file in the repository"
    assert problem("README.md", "file:///etc/passwd") is not None
    assert problem("README.md", "/docs/operations.md") is not None
    assert problem("README.md", "docs/operations.md#no-such-heading") is not None
    assert problem("README.md", "docs/operations.md#exit-codes") is None
    assert problem("README.md", "deploy") is None
    assert problem("docs/operations.md", "../deploy/steward.service") is None


def test_slugs_follow_github() -> None:
    assert slug("5a. Input and connections") == "5a-input-and-connections"
    assert slug("Metrics: `GET /metrics`") == "metrics-get-metrics"
    assert slug("What [the report](x.md) says") == "what-the-report-says"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
