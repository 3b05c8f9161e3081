"""Parity verdicts as data: JSON report, JUnit XML, a Markdown summary and the exit code.

A :class:`Verdict` is a list of :class:`Check` (one per engine x check: ``run``,
``numeric/<output>``, ``uq/<metric>``, ``weights`` when the engine's ONNX graph is known: every
graph weight against the reference parameter, per tensor in its data), each ``pass``, ``fail``,
``error`` or ``unresolved`` (a rank metric on reference scores flat at the candidate's precision,
which rounding alone can put in any order: neither pass nor fail, see
:mod:`toolchain.parity.resolution`), with its message and every number. Every failure is listed, never just the first.

Exit code (:attr:`Verdict.exit_code`, raised by :meth:`Verdict.raise_for_status`):

* 0 - every check passed (or is ``unresolved``);
* 1 - at least one check failed (:class:`~toolchain.errors.CheckFailed`);
* 2 - the run itself could not happen for at least one engine (missing engine file, bad input,
  a reference that produces NaN): :class:`~toolchain.errors.ToolchainError`. An incomplete gate
  outranks failed checks: the failures are still listed in the reports and the message;
* 3 - only missing optional components (TensorRT, CUDA) stopped an engine:
  :class:`~toolchain.errors.MissingDependencyError`.

Files (:meth:`Verdict.write`, each written atomically: temporary file + ``os.replace``):
``report.json`` (schema ``hydra-toolchain/parity/1``), ``junit.xml`` (one ``<testsuite>`` per
engine named ``parity.<engine>``, one ``<testcase classname="parity.<engine>" name="<check>">``
per check, ``<failure message=...>`` / ``<error message=...>`` carrying the numbers) and
``summary.md``; an ``unresolved`` check is a ``<skipped message=...>`` test case in JUnit.

The files are deterministic: the same checks give byte-identical files (no wall-clock timestamp,
no durations; keys sorted). Timings stay on the :class:`Check` objects (``seconds``) and in the log.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from toolchain.artifacts import atomic_write_bytes
from toolchain.errors import CheckFailed, MissingDependencyError, ToolchainError

__all__ = ["SCHEMA", "Check", "Verdict"]

SCHEMA = "hydra-toolchain/parity/1"
Status = Literal["pass", "fail", "error", "unresolved"]
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
_MAX_MESSAGE = 2000


@dataclass(frozen=True)
class Check:
    """One engine x check result.

    Args:
        engine: candidate name (``reference`` for problems with the reference itself).
        name: ``run``, ``numeric/<output>``, ``uq/<metric>`` or ``weights``.
        status: ``pass`` | ``fail`` | ``error`` | ``unresolved``.
        message: one paragraph naming what broke and the numbers.
        data: every number and the tolerance (JSON-ready after :func:`jsonable`).
        seconds: time spent (the engine's inference time for ``run``); kept in memory, not in the files.
        exit_code: for ``error``: 2 (the run could not happen) or 3 (missing optional component).
    """

    engine: str
    name: str
    status: Status
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    exit_code: int = 0

    @property
    def kind(self) -> str:
        """``run``, ``numeric``, ``uq`` or ``weights``."""
        return self.name.split("/", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without ``seconds``: the report must not change between identical runs)."""
        return {"engine": self.engine, "name": self.name, "kind": self.kind, "status": self.status,
                "message": self.message, "exit_code": self.exit_code, "data": jsonable(self.data)}


def jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays unwrapped, NaN/Inf as the strings ``"NaN"``/``"Infinity"``."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Path):
        return str(value)
    return value


def _classname(engine: str) -> str:
    return "parity." + re.sub(r"[^A-Za-z0-9_-]", "_", engine)


def _xml_text(text: str, limit: int | None = None) -> str:
    text = _XML_BAD.sub("?", text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


@dataclass
class Verdict:
    """The whole gate: every check of every engine, plus what it ran with (``meta``)."""

    reference: str
    engines: list[str]
    checks: list[Check]
    meta: dict[str, Any] = field(default_factory=dict)
    #: engine -> where it first diverges (``parity --localize``: :mod:`toolchain.parity.localize` dicts)
    localization: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    # ---------------------------------------------------------------------------- status
    @property
    def failures(self) -> list[Check]:
        """Checks that ran and failed."""
        return [c for c in self.checks if c.status == "fail"]

    def rescuable_engines(self) -> list[str]:
        """Engines with a failed numeric or UQ check: what keeping nodes in FP32 (a precision rescue) can fix.

        Stale weights and an engine that ran a lower precision than asked are not among them.
        """
        return sorted({c.engine for c in self.failures if c.kind in ("numeric", "uq")})

    @property
    def errors(self) -> list[Check]:
        """Checks that could not run."""
        return [c for c in self.checks if c.status == "error"]

    @property
    def unresolved(self) -> list[Check]:
        """Checks that ran but cannot be judged at this precision on these samples (neither pass nor fail)."""
        return [c for c in self.checks if c.status == "unresolved"]

    @property
    def passed(self) -> bool:
        """True when no check failed or errored (and there is at least one); unresolved checks do not fail."""
        return bool(self.checks) and not self.failures and not self.errors

    @property
    def exit_code(self) -> int:
        """0 pass, 1 a check failed, 2 the run could not happen, 3 only missing optional components."""
        codes = {c.exit_code or 2 for c in self.errors}
        if codes - {3} or not self.checks:
            return 2  # an engine (or the reference) could not run, or nothing was checked at all
        if codes:
            return 3
        return 1 if self.failures else 0

    @property
    def status(self) -> str:
        """``pass``, ``fail`` or ``error``."""
        return {0: "pass", 1: "fail"}.get(self.exit_code, "error")

    def engine_checks(self, engine: str) -> list[Check]:
        """The checks of one engine, in order."""
        return [c for c in self.checks if c.engine == engine]

    def headline(self) -> str:
        """One line: status, counts and where to look."""
        n = len(self.checks) - len(self.failures) - len(self.errors) - len(self.unresolved)
        return (f"parity {self.status.upper()} (exit {self.exit_code}): {n} passed, {len(self.failures)} failed, "
                f"{len(self.errors)} errors, {len(self.unresolved)} not resolvable over {len(self.engines)} "
                f"engine(s) vs reference '{self.reference}'")

    def problems(self) -> list[str]:
        """Every failure and error, one line each: ``engine check: message``."""
        return [f"[{c.status}] {c.engine} {c.name}: {c.message}" for c in self.checks if c.status in ("fail", "error")]

    def notes(self) -> list[str]:
        """Every unresolved check, one line each, with the reason."""
        return [f"[unresolved] {c.engine} {c.name}: {c.message}" for c in self.unresolved]

    def raise_for_status(self) -> None:
        """Raise the exception whose exit code matches :attr:`exit_code`; return on a pass."""
        code = self.exit_code
        if code == 0:
            return
        text = self.headline() + ".\n" + "\n".join(self.problems())
        if code == 1:
            raise CheckFailed(text)
        if code == 3:
            raise MissingDependencyError(text)
        raise ToolchainError(text)

    # ---------------------------------------------------------------------------- renderers
    def to_dict(self) -> dict[str, Any]:
        """The JSON report: status, every check with its numbers and tolerance, the run's meta."""
        engines = {}
        for engine in self.engines:
            checks = self.engine_checks(engine)
            status = "error" if any(c.status == "error" for c in checks) else (
                "fail" if any(c.status == "fail" for c in checks) else "pass")
            engines[engine] = {"status": status, "checks": [c.to_dict() for c in checks]}
            if engine in self.localization:
                engines[engine]["localization"] = self.localization[engine]
        other = [c.to_dict() for c in self.checks if c.engine not in self.engines]
        return jsonable({
            "schema": SCHEMA, "status": self.status, "exit_code": self.exit_code,
            "reference": self.reference, "summary": {
                "checks": len(self.checks),
                "passed": len(self.checks) - len(self.failures) - len(self.errors) - len(self.unresolved),
                "failed": len(self.failures), "errors": len(self.errors), "unresolved": len(self.unresolved)},
            "engines": engines, "other_checks": other, "problems": self.problems(), "unresolved": self.notes(),
            "meta": self.meta,
        })

    def to_junit_xml(self) -> str:
        """JUnit XML: one testsuite per engine (``parity.<engine>``), one testcase per check."""
        groups = list(self.engines) + sorted({c.engine for c in self.checks} - set(self.engines))
        root = ET.Element("testsuites", {
            "name": "hydra-toolchain parity", "tests": str(len(self.checks)), "failures": str(len(self.failures)),
            "errors": str(len(self.errors)), "skipped": str(len(self.unresolved)),
        })
        for engine in groups:
            checks = self.engine_checks(engine)
            suite = ET.SubElement(root, "testsuite", {
                "name": _classname(engine), "tests": str(len(checks)),
                "failures": str(sum(c.status == "fail" for c in checks)),
                "errors": str(sum(c.status == "error" for c in checks)),
                "skipped": str(sum(c.status == "unresolved" for c in checks)),
            })
            props = ET.SubElement(suite, "properties")
            for key, value in (("reference", self.reference),
                               ("precision", str(self.meta.get("precisions", {}).get(engine, ""))),
                               *((("weights", str(self.meta["weights"][engine])),)
                                 if engine in self.meta.get("weights", {}) else ())):
                ET.SubElement(props, "property", {"name": key, "value": _xml_text(value)})
            for check in checks:
                case = ET.SubElement(suite, "testcase", {
                    "classname": _classname(engine), "name": check.name})
                if check.status == "unresolved":
                    ET.SubElement(case, "skipped", {"message": _xml_text(check.message, _MAX_MESSAGE)}).text = \
                        _xml_text(json.dumps(jsonable(check.data), indent=1, sort_keys=True))
                elif check.status != "pass":
                    tag = "failure" if check.status == "fail" else "error"
                    node = ET.SubElement(case, tag, {
                        "message": _xml_text(check.message, _MAX_MESSAGE),
                        "type": "ParityFailure" if tag == "failure" else "ParityError"})
                    node.text = _xml_text(check.message + "\n" + json.dumps(jsonable(check.data), indent=1,
                                                                            sort_keys=True))
                else:
                    ET.SubElement(case, "system-out").text = _xml_text(check.message)
        ET.indent(root)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

    def to_markdown(self) -> str:
        """A short Markdown summary: headline, a table per engine, then every failure and error."""
        lines = [f"## Parity: {self.status.upper()} (exit {self.exit_code})", "", self.headline() + ".", "",
                 "| engine | precision | run | numeric | uq | status |", "|---|---|---|---|---|---|"]
        kinds = ["run", "numeric", "uq"]
        if "weights" in self.meta or any(c.kind == "weights" for c in self.checks):  # a column only when checked
            kinds.append("weights")
            lines[-2:] = ["| engine | precision | run | numeric | uq | weights | status |", "|---" * 7 + "|"]
        precisions = self.meta.get("precisions", {})
        for engine in self.engines + sorted({c.engine for c in self.checks} - set(self.engines)):
            checks = self.engine_checks(engine)
            cells = []
            for kind in kinds:
                sub = [c for c in checks if c.kind == kind]
                ok = sum(c.status == "pass" for c in sub)
                unresolved = sum(c.status == "unresolved" for c in sub)
                if kind == "weights" and len(sub) == 1 and "checked" in sub[0].data:  # tensors, not checks
                    data = sub[0].data
                    cells.append(f"{data['checked'] - data['failed']}/{data['checked']}")
                    continue
                cells.append((f"{ok}/{len(sub)}" + (f" ({unresolved} not resolvable)" if unresolved else ""))
                             if sub else ("not checked" if kind == "weights" and "weights" in self.meta else "-"))
            status = "error" if any(c.status == "error" for c in checks) else (
                "**FAIL**" if any(c.status == "fail" for c in checks) else "pass")
            precision = precisions.get(engine, "")
            asked = self.meta.get("engines", {}).get(engine, {}).get("precision_asked")
            if asked not in (None, precision):  # the engine ran another precision than asked (read back from it)
                precision += f" ({asked} asked)"
            lines.append(f"| {engine} | {precision} | " + " | ".join(cells) + f" | {status} |")
        problems = [c for c in self.checks if c.status in ("fail", "error")]
        if problems:
            lines += ["", "### Failures and errors", ""]
            lines += [f"- **{c.engine}** `{c.name}` ({c.status}): {c.message}" for c in problems]
        weights = [c for c in self.checks if c.kind == "weights" and c.status == "fail"]
        if weights or any(str(v).startswith("not checked") for v in self.meta.get("weights", {}).values()):
            lines += ["", "### Weights (every graph weight vs the reference's parameter)", ""]
            for check in weights:
                lines += [f"- **{check.engine}** (`{check.data.get('graph', '')}`):"]
                lines += [f"  - `{t['initializer']}` vs `{t['reference'] or '-'}` ({t['how']}): max abs diff "
                          f"{t['max_abs_diff']}, {t['max_ulps']} ULPs (allowed {t['allowed_ulps']})"
                          for t in check.data.get("tensors", []) if t["status"] == "fail"][:20]
            lines += [f"- **{engine}**: weights {reason}" for engine, reason in self.meta.get("weights", {}).items()
                      if str(reason).startswith("not checked")]
        if self.localization:
            lines += ["", "### Where it diverges (--localize)", ""]
            lines += [f"- **{engine}**: {item['summary']}" for engine, items in self.localization.items()
                      for item in items]
        if self.unresolved:
            lines += ["", "### Not resolvable (neither pass nor fail; the numeric checks still gate)", ""]
            lines += [f"- **{c.engine}** `{c.name}`: {c.message}" for c in self.unresolved]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path) -> dict[str, Path]:
        """Write ``report.json``, ``junit.xml`` and ``summary.md`` atomically into ``out_dir``."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        files = {
            "report": (out_dir / "report.json",
                       json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"),
            "junit": (out_dir / "junit.xml", self.to_junit_xml()),
            "summary": (out_dir / "summary.md", self.to_markdown()),
        }
        for path, text in files.values():
            atomic_write_bytes(path, text.encode("utf-8"))
        return {key: path for key, (path, _) in files.items()}
