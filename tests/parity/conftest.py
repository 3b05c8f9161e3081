"""Session fixtures for the parity tests: the tiny ViT case (ONNX export + ID/OOD eval data)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: make parity_models importable

from parity_models import VitCase, build_vit_case


@pytest.fixture(scope="session")
def vit_case(tmp_path_factory: pytest.TempPathFactory) -> VitCase:
    return build_vit_case(tmp_path_factory.mktemp("parity_vit"))
