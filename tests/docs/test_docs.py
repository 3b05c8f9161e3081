"""The pages cannot drift: links resolve, runnable blocks run, the layers are the contract's, the front page is short.

* every relative link of README.md, docs/*.md and benchmarks/**/*.md points to an existing file,
  and to an existing heading where it names an ``#anchor``;
* every code block marked ``<!-- runnable -->`` runs as written from the repository root (in this
  process); the block marked ``<!-- python-api-example -->`` (run end to end by
  tests/export/test_parity_verb.py, which needs a Hydra folder) exists once and calls only what
  the package exports;
* the layers drawn in docs/architecture.md are import-linter's layers in pyproject.toml;
* README.md is the front page: at most 250 lines, the own-checkpoint and CI-on-files commands in
  its first 60, the Quick start commands as .ci/run runs them.
"""

from __future__ import annotations

import ast
import re
import tomllib

import pytest
from doc_text import DOC_PAGES, DOCS, LINKED_PAGES, README, ROOT, anchors, code_blocks, links, slug

import toolchain

LINKS = [(page, target) for page in LINKED_PAGES for target in links(page)
         if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked


def test_pages_have_relative_links():
    assert len(LINKS) > 50 and any(t.startswith("#") for _, t in LINKS) and any("#" in t[1:] for _, t in LINKS)


@pytest.mark.parametrize("page,target", LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_relative_link_points_to_an_existing_file_and_heading(page, target):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(ROOT)}: link to '{target}': {dest} does not exist"
    if anchor:
        assert dest.suffix == ".md", f"{page.relative_to(ROOT)}: '#{anchor}' on a file that is not Markdown"
        assert anchor in anchors(dest), (f"{page.relative_to(ROOT)}: link to '{target}': no heading with anchor "
                                         f"'{anchor}' in {dest.name} (anchors: {sorted(anchors(dest))})")


def test_heading_anchors_follow_github():
    assert slug("`hydra-toolchain parity`") == "hydra-toolchain-parity"
    assert slug("Caching, the lock and `verify`") == "caching-the-lock-and-verify"
    assert slug("`--localize`: where it diverges") == "--localize-where-it-diverges"


RUNNABLE = [b for page in DOC_PAGES for b in code_blocks(page) if b.marker == "runnable"]


def test_there_are_runnable_blocks():
    assert RUNNABLE and all(b.lang == "python" for b in RUNNABLE)


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.page.name}:{b.line}" for b in RUNNABLE])
def test_runnable_block_runs_as_written(block, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exec(compile(block.text, f"{block.page.name}:{block.line}", "exec"), {"__name__": "__doc_block__"})
    assert capsys.readouterr().out.strip(), "a runnable block should show something (print its result)"


def test_python_api_example_exists_once_and_uses_the_packages_api():
    blocks = [b for page in DOC_PAGES for b in code_blocks(page) if b.marker == "python-api-example"]
    assert len(blocks) == 1, [f"{b.page.name}:{b.line}" for b in blocks]
    tree = ast.parse(blocks[0].text)
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "toolchain"}
    assert used >= {"export_graphs", "check_parity", "bench_graphs", "inspect_path"}
    assert not [name for name in used if not hasattr(toolchain, name)]


def _documented_layers() -> list[str]:
    text = (DOCS / "architecture.md").read_text()
    block = next(b for b in code_blocks(DOCS / "architecture.md") if b.marker == "layers")
    assert block.text in text
    return [re.split(r"\s{2,}", line.strip())[0] for line in block.text.splitlines() if line.strip()]


def test_the_layers_on_the_architecture_page_are_the_import_contracts():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    expected = [" | ".join(p.strip().removeprefix("toolchain.") for p in layer.split("|"))
                for layer in contract["layers"]]
    assert _documented_layers() == expected


QUICK_START = ["bash scripts/setup.sh && .venv/bin/hydra-toolchain run recipes/minilm-tweets.yaml",
               "bash scripts/setup.sh && .venv/bin/python -m pytest -n 2 --dist worksteal"]


def test_readme_quick_start_is_what_ci_runs():
    blocks = [b.text.strip() for b in code_blocks(README)]
    assert blocks[:2] == QUICK_START
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert QUICK_START[1] in ci


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:60])
    assert "hydra-toolchain run recipes/own-checkpoint.yaml" in first_screen
    assert re.search(r"hydra-toolchain parity \S+\.onnx .*\n.*--reference", first_screen)
    assert "--inputs parity-inputs.npz" in first_screen and "--save-inputs" in first_screen
    for page in ["commands", "recipes", "parity", "architecture", "families", "gpu", "results"]:
        assert f"(docs/{page}.md)" in README.read_text(), page


def test_every_docs_page_is_linked_from_the_readme():
    text = README.read_text()
    assert [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in text] == []


def test_no_page_mentions_a_results_file_that_is_missing():
    """Backticked ``benchmarks/.../*.md`` / ``.json`` paths in prose exist (or are named as written by a command)."""
    missing = []
    for page in LINKED_PAGES:
        for path in re.findall(r"`(benchmarks/[\w./-]+\.(?:md|json))`", page.read_text()):
            if not (ROOT / path).exists() and "writes `" + path not in page.read_text():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, missing
