"""The package's layers (docs/architecture.md, Layers) held by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    exe = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "toolchain").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_no_import_cycle_between_modules():
    """No two modules of the package import each other, directly or through others (grimp's graph,
    which also counts imports inside functions and under TYPE_CHECKING)."""
    import grimp

    graph = grimp.build_graph("toolchain")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} <-> {imported}")
    assert not cycles, cycles
