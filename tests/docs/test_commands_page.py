"""docs/commands.md against the CLI: every command and option documented, every documented flag real.

The CLI is the click command tree typer builds from ``toolchain.cli.app`` (in process, nothing is
run). Each command has a section ``## `hydra-toolchain NAME` `` on the page; its options (long and
short names) must appear in that section, and every ``--flag`` the section names must be one of
that command's options or a global one. Every ``hydra-toolchain`` command line in a code block of
README.md or docs/*.md must name a real command and only its options.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import typer
from doc_text import DOC_PAGES, DOCS, code_blocks, sections

from toolchain.cli import app

PAGE = DOCS / "commands.md"
HEADING = re.compile(r"^`hydra-toolchain ([\w-]+)`$")
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PROGRAM = re.compile(r"(?:hydra-toolchain|-m toolchain)\s+([a-z][\w-]*)")


def cli_tree() -> Any:
    """The click command group typer builds (typer 0.29 vendors click: its classes, not ``click``'s)."""
    return typer.main.get_command(app)


def global_flags(group: Any) -> set[str]:
    return {o for p in group.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}


def option_names(command: Any) -> set[str]:
    """Every name of every option of ``command`` (``--out``, ``-o``); ``--help`` is implicit."""
    return {o for p in command.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}


def command_sections(text: str) -> dict[str, str]:
    return {m.group(1): body for title, body in sections(text).items() if (m := HEADING.match(title))}


def _mentions(body: str, name: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", body) is not None


def undocumented(group: Any, text: str) -> list[str]:
    """What the CLI has and the page lacks: commands without a section, options missing from their section."""
    pages = command_sections(text)
    problems = []
    for name, command in group.commands.items():
        if name not in pages:
            problems.append(f"command '{name}' has no '## `hydra-toolchain {name}`' section")
            continue
        problems += [f"{name}: option {o} is not documented in its section" for o in sorted(option_names(command))
                     if not _mentions(pages[name], o)]
    return problems


def unknown_documented(group: Any, text: str) -> list[str]:
    """What the page documents and the CLI lacks: sections of no command, flags no command (or not this one) has."""
    text = re.sub(r"\]\([^)]*\)", "]()", text)  # a link's target (an anchor such as #--localize-...) is no flag
    pages = command_sections(text)
    known_global = global_flags(group)
    problems = [f"section '{name}' documents no command of the CLI" for name in pages if name not in group.commands]
    for name, body in pages.items():
        if name in group.commands:
            allowed = option_names(group.commands[name]) | known_global
            problems += [f"{name}: {flag} is documented but the command has no such option"
                         for flag in sorted(set(LONG_FLAG.findall(body)) - allowed)]
    every = known_global.union(*(option_names(c) for c in group.commands.values()))
    rest = text
    for body in pages.values():
        rest = rest.replace(body, "")
    problems += [f"{flag} is mentioned on the page but no command has it"
                 for flag in sorted(set(LONG_FLAG.findall(rest)) - every)]
    return problems


def test_every_command_and_option_of_the_cli_is_documented_in_its_section():
    group = cli_tree()
    assert set(group.commands) >= {"run", "export", "build", "parity", "bench", "infer", "verify"}
    assert {"--localize", "--reference", "-r"} <= option_names(group.commands["parity"])
    assert undocumented(group, PAGE.read_text()) == []


def test_every_flag_the_page_documents_exists_on_its_command():
    assert unknown_documented(cli_tree(), PAGE.read_text()) == []


def test_an_option_added_to_the_cli_without_documentation_is_caught():
    """The check above can fail: a copy of the CLI with one more option on ``parity`` is reported."""
    group = copy.deepcopy(cli_tree())
    parity = group.commands["parity"]
    new = copy.deepcopy(next(p for p in parity.params if p.param_type_name == "option"))
    new.name, new.opts, new.secondary_opts = "brand_new_flag", ["--brand-new-flag"], []
    parity.params.append(new)
    group.commands["frobnicate"] = copy.deepcopy(group.commands["verify"])
    problems = undocumented(group, PAGE.read_text())
    assert "parity: option --brand-new-flag is not documented in its section" in problems
    assert any("'frobnicate'" in p for p in problems)


def test_a_flag_documented_but_absent_from_the_cli_is_caught():
    text = PAGE.read_text().replace("| `--rescue` |", "| `--rescue`, `--rescue-harder` |", 1)
    assert "parity: --rescue-harder is documented but the command has no such option" in \
        unknown_documented(cli_tree(), text)


def _commands_in(block) -> list[tuple[str, str]]:
    """``(command, its text)`` of every program call in a code block (bash: ``\\`` continues a line; YAML:
    the call runs to the next list item, key or comment)."""
    lines = block.text.splitlines()
    calls = []
    for i, line in enumerate(lines):
        for m in PROGRAM.finditer(line):
            text, j = line[m.start():], i
            while j + 1 < len(lines) and (
                    text.rstrip().endswith("\\") if block.lang != "yaml"
                    else not re.match(r"^\s*(- |#|[\w-]+:)", lines[j + 1])):
                j += 1
                text += "\n" + lines[j]
            text = re.split(r"\s#\s", text)[0] if block.lang != "yaml" else text  # a trailing comment
            calls.append((m.group(1), text))
    return calls


CALLS = [(block, name, text) for page in DOC_PAGES for block in code_blocks(page) for name, text in _commands_in(block)]


def test_the_pages_show_command_lines():
    assert len(CALLS) > 30 and {name for _, name, _ in CALLS} >= {"run", "export", "parity", "bench", "build"}


@pytest.mark.parametrize("block,name,text", CALLS, ids=[f"{b.page.name}:{b.line}:{n}" for b, n, _ in CALLS])
def test_command_lines_in_code_blocks_use_real_commands_and_flags(block, name, text):
    group = cli_tree()
    assert name in group.commands, f"{block.page.name} line {block.line}: no command '{name}'"
    allowed = option_names(group.commands[name]) | global_flags(group)
    body = text.split(name, 1)[1]
    unknown = sorted(set(LONG_FLAG.findall(body)) - allowed)
    assert not unknown, f"{block.page.name} line {block.line}: {name} has no option(s) {unknown}"
