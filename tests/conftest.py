"""Test-wide settings: offline hub, deterministic torch, few threads (CI has 2 cores)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _string_literals(path) -> list[tuple[int, str]]:
    """``(line, value)`` of every string constant in a Python file that is not a docstring/bare string."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(path).read_text(), filename=str(path))
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare]


@pytest.fixture(scope="session")
def string_literals():
    """The registry tests' source scan: :func:`_string_literals` (docstrings and comments are allowed)."""
    return _string_literals
