"""README.zh-CN.md keeps in step with README.md: they link each other, the Chinese one has
a section for each English section (or links it), and both give the same commands there,
the same figures, the same topic links and the tour."""

from __future__ import annotations

import re

from conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
README_ZH = REPO_ROOT / "README.zh-CN.md"

# Every English section -> its Chinese counterpart (README.md is the front door: its topics
# live in docs/, linked from both READMEs' last section)
SECTIONS = {
    "Two commands": "两条命令",
    "What `make demo` does, and what you get": "`make demo` 做了什么，你会得到什么",
    "Read the code": "读代码",
    "Every head, interactive": "每个头，可交互",
    "Tour": "导览",
    "Usage": "用法",
    "Layout": "目录结构",
    "Topics": "专题（英文）",
}


def sections(text: str) -> dict[str, str]:
    """``{"## " heading: its text up to the next "## " heading}`` (### stay inside)."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def preamble(text: str) -> str:
    """The text before the first "## " heading."""
    return re.split(r"^## ", text, maxsplit=1, flags=re.M)[0]


def commands(text: str) -> list[str]:
    """The lines of its ```bash blocks, comments and surrounding spaces removed."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.splitlines():
            line = re.sub(r"(^|\s+)#\s.*$", "", line).strip()
            if line:
                out.append(re.sub(r"\s+", " ", line))
    return out


def images(text: str) -> set[str]:
    """Image paths: ![...](path) and <img src="path">."""
    return set(re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)) | \
        set(re.findall(r'<img\s[^>]*src="([^"]+)"', text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_helpers_read_markdown_as_github_does():
    text = "# t\nintro\n## A b\n```bash\nmake x   # c\n```\n### sub\n![f](p.png)\n## C\n"
    assert preamble(text) == "# t\nintro\n"
    assert list(sections(text)) == ["A b", "C"]
    assert commands(sections(text)["A b"]) == ["make x"]
    assert images(text) == {"p.png"}
    assert anchor("Reliability: what is guaranteed") == "reliability-what-is-guaranteed"
    assert anchor("What `make demo` does, and what you get") == \
        "what-make-demo-does-and-what-you-get"


def test_readmes_link_each_other_at_the_top():
    assert "](README.zh-CN.md)" in preamble(README.read_text(encoding="utf-8")), \
        "README.md: link README.zh-CN.md before the first section"
    assert "](README.md)" in preamble(README_ZH.read_text(encoding="utf-8")), \
        "README.zh-CN.md: link README.md before the first section"


def test_every_english_section_has_a_chinese_one_or_a_link():
    en = sections(README.read_text(encoding="utf-8"))
    zh_text = README_ZH.read_text(encoding="utf-8")
    zh = sections(zh_text)
    for title, zh_title in SECTIONS.items():
        assert title in en, f"README.md has no section '## {title}' (update SECTIONS)"
        assert zh_title in zh, f"README.zh-CN.md has no section '## {zh_title}' ({title})"
    for title in en.keys() - SECTIONS.keys():
        assert f"(README.md#{anchor(title)})" in zh_text, \
            f"README.zh-CN.md neither translates nor links README.md's '## {title}'"


def test_both_give_the_same_commands_figures_and_the_tour():
    en = sections(README.read_text(encoding="utf-8"))
    zh = sections(README_ZH.read_text(encoding="utf-8"))
    for title, zh_title in SECTIONS.items():
        assert title in en and zh_title in zh, f"section missing: {title} / {zh_title}"
        assert commands(zh[zh_title]) == commands(en[title]), f"commands differ in {title}"
        assert images(en[title]) <= images(zh[zh_title]), f"figures missing in {zh_title}"
    for text in (en, zh):
        lines = [c for body in text.values() for c in commands(body)]
        assert {"make demo", "make test", "make tour"} <= set(lines)
    assert "notebooks/tour.py" in en["Tour"] and "notebooks/tour.py" in zh["导览"]


def links(text: str) -> list[str]:
    """Link targets of [text](target), in order."""
    return re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text)


def test_both_link_the_same_topics():
    en = sections(README.read_text(encoding="utf-8"))
    zh = sections(README_ZH.read_text(encoding="utf-8"))
    assert links(en["Topics"]) == links(zh["专题（英文）"])
    assert len(links(en["Topics"])) >= 8
