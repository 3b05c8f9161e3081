"""Reading the Markdown pages: which pages, their code blocks, sections, links and heading anchors."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: the pages whose links are checked: the front page, the reference pages, the benchmarks' results
LINKED_PAGES = [README, *sorted(DOCS.glob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]
#: the pages whose code blocks are checked (commands, runnable blocks)
DOC_PAGES = [README, *sorted(DOCS.glob("*.md"))]


def script(relpath: str, name: str):
    """A script that is not a package module (``scripts/gen_docs.py``), loaded from its path."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Block:
    """A fenced code block: its page, language, text, the HTML comment right above it (its marker)."""

    page: Path
    lang: str
    text: str
    marker: str | None
    line: int


def code_blocks(page: Path) -> list[Block]:
    """Every fenced code block of ``page`` with the ``<!-- marker -->`` on the line(s) just above it."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        start, lang = i, match.group(2)
        i += 1
        body = []
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        above = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = m.group(1).strip() if (m := re.fullmatch(r"<!--\s*(.*?)\s*-->", above)) else None
        blocks.append(Block(page, lang, "\n".join(body), marker, start + 1))
        i += 1
    return blocks


def without_code(text: str) -> str:
    """``text`` with fenced code blocks blanked to spaces (positions kept; headings and links in them do not count)."""
    return re.sub(r"^\s*```.*?^\s*```", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S | re.M)


def sections(text: str, level: int = 2) -> dict[str, str]:
    """Heading text of each ``level`` heading -> the text under it (code blocks included), up to the next
    heading of that level or above (headings inside code blocks do not count)."""
    marks = list(re.finditer(rf"^(#{{1,{level}}}) (.+)$", without_code(text), re.M))
    out: dict[str, str] = {}
    for k, m in enumerate(marks):
        if len(m.group(1)) == level:
            end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
            out[m.group(2).strip()] = text[m.end():end]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page`` (repeated headings get ``-1``, ``-2`` as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", without_code(page.read_text()), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(page: Path) -> list[str]:
    """The targets of the Markdown links of ``page`` outside code (inline code spans too)."""
    text = re.sub(r"`[^`]+`", "", without_code(page.read_text()))
    return re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text) + re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
