"""The front door and the docs hold together: README.md stays short, and every relative link
and image of README.md, README.zh-CN.md and docs/*.md points at a file that exists (and a
``#anchor`` at a heading of that file, slugged as GitHub does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT

MAX_README_LINES = 250
PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "README.zh-CN.md",
         *sorted((REPO_ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a ``# comment`` there is no heading)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lower case, spaces to
    hyphens (letters of any script, digits, ``_`` and ``-`` stay)."""
    text = re.sub(r"<[^>]+>|`|\*", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", prose(text), flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def targets(text: str) -> list[str]:
    """Relative link and image targets, in order (web and mail links left out)."""
    found = LINK.findall(prose(text)) + IMG.findall(prose(text))
    return [t for t in found if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def broken(page: Path) -> list[str]:
    """``"<target>: why"`` for each link of ``page`` that leads nowhere."""
    bad = []
    for target in targets(page.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and \
                anchor not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def test_the_helpers_read_markdown_as_github_does(tmp_path):
    assert slug("What `make demo` does, and what you get") == \
        "what-make-demo-does-and-what-you-get"
    assert slug("每个头，可交互") == "每个头可交互"
    assert slug("Do more heads help? The n_heads sweep") == "do-more-heads-help-the-n_heads-sweep"
    assert slug("Deploying: CTranslate2 (`tinymt/ct2/`)") == "deploying-ctranslate2-tinymtct2"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## B ##\n") == {"a", "a-1", "b"}
    (tmp_path / "there.md").write_text("# Here\n", encoding="utf-8")
    (tmp_path / "img.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](there.md#here) ![i](img.png) [web](https://x.org/y)\n"
                    "[self](#top) <img src=\"img.png\" width=\"3\">\n"
                    "[gone](missing.md) [bad anchor](there.md#nowhere) [no](#nothing)\n"
                    "```\n[in code](not-checked.md)\n```\n", encoding="utf-8")
    assert [b.split(":")[0] for b in broken(page)] == \
        ["missing.md", "there.md#nowhere", "#nothing"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_link_resolves(page):
    assert len(targets(page.read_text(encoding="utf-8"))) > 0 or page.parent.name == "docs"
    assert broken(page) == []


def test_readme_is_a_front_door():
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, \
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move a topic to docs/"
    first = next(i for i, line in enumerate(lines) if line.startswith("## "))
    assert lines[first] == "## Two commands" and "make demo" in lines[first + 3] and \
        "make test" in lines[first + 4], "the two commands come first"
