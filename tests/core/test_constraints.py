"""constraints.txt pins every dependency the set-up installs, at versions pyproject.toml allows (issue 31)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        assert version and not any(c in version for c in "<>=!~*, "), f"not an exact pin: {line!r}"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_dependency_of_the_set_up_is_pinned_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in ("demo", "dev"):  # what scripts/setup.sh installs: -e ".[demo,dev]"
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    pins = _pins()
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt (run scripts/refresh-constraints.sh)"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
    assert pins["torch"] == Version("2.13.0")  # the local CPU wheel scripts/setup.sh installs first
    assert "openvino" in pins and "typer" in pins


def test_the_set_up_installs_with_the_constraints_and_stamps_them():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'PIN=(-c "$CONSTRAINTS")' in setup and setup.count('"${PIN[@]}"') == 2
    assert 'cat "$CONSTRAINTS"' in setup.split("WANT=", 1)[1].split("\n\n", 1)[0]  # the stamp hashes the pins
