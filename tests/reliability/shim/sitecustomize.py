"""Test shim: make the data packages named in HYDRA_TEST_HIDE look uninstalled (for CLI tests)."""

import importlib.util
import os

_hidden = set(filter(None, os.environ.get("HYDRA_TEST_HIDE", "").split(",")))
_find_spec = importlib.util.find_spec


def _fake_find_spec(name, package=None):
    if name.split(".")[0] in _hidden:
        return None
    return _find_spec(name, package)


importlib.util.find_spec = _fake_find_spec
