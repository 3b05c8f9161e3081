"""Shared helpers for the scoring tests: tiny models and labelled calibration batches."""

from __future__ import annotations

import pytest

from toolchain.models.tiny import TINY_MODELS

FAMILIES = sorted(TINY_MODELS)


def _make_calib(tiny, sizes=(4, 3), seed=0):
    """Labelled calibration batches: random labels over the model's classes (TinyModel.labelled_batches)."""
    return tiny.labelled_batches(sizes, seed)


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def tiny(family):
    return TINY_MODELS[family]()


@pytest.fixture
def bert():
    return TINY_MODELS["bert"]()


@pytest.fixture(name="make_calib")
def make_calib_fixture():
    """``make_calib(tiny, sizes=(4, 3), seed=0)`` -> list of (batch, labels)."""
    return _make_calib


@pytest.fixture
def calib(tiny):
    return _make_calib(tiny)
