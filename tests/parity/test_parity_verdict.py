"""Verdict as data: exit codes, JUnit XML (junitparser and xml.etree), JSON report, Markdown, atomic files."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest
from junitparser import Error, Failure, JUnitXml

from toolchain.errors import CheckFailed, MissingDependencyError, ToolchainError
from toolchain.parity.verdict import SCHEMA, Check, Verdict


def _verdict(*statuses: tuple[str, str, str, int]) -> Verdict:
    checks = [Check(engine, name, status, f"{name} on {engine}: {status} (max|c-r| 0.25 > 0.1)",
                    {"value": 0.25, "limit": 0.1, "nan": math.nan}, 0.01, code)
              for engine, name, status, code in statuses]
    engines = list(dict.fromkeys(c.engine for c in checks if c.engine != "reference"))
    return Verdict("torch-fp32", engines, checks, {"precisions": {e: "fp16" for e in engines}})


PASS = ("ort.fp16", "numeric/probs", "pass", 0)
FAIL = ("ort.fp16", "numeric/logits", "fail", 0)
FAIL_UQ = ("trt", "uq/auroc_msp", "fail", 0)
ERROR = ("trt-missing", "run", "error", 2)
NODEP = ("trt-missing", "run", "error", 3)


class TestExitCodes:
    def test_all_pass_is_0(self):
        verdict = _verdict(PASS, ("trt", "uq/ece", "pass", 0))
        assert verdict.exit_code == 0 and verdict.passed and verdict.status == "pass"
        verdict.raise_for_status()

    def test_failed_check_is_1_and_lists_every_failure(self):
        verdict = _verdict(PASS, FAIL, FAIL_UQ)
        assert verdict.exit_code == 1
        with pytest.raises(CheckFailed) as info:
            verdict.raise_for_status()
        assert info.value.exit_code == 1
        assert "ort.fp16 numeric/logits" in str(info.value) and "trt uq/auroc_msp" in str(info.value)

    def test_run_error_is_2_and_outranks_failures(self):
        verdict = _verdict(PASS, FAIL, ERROR)
        assert verdict.exit_code == 2 and verdict.status == "error"
        with pytest.raises(ToolchainError) as info:
            verdict.raise_for_status()
        assert info.value.exit_code == 2 and "numeric/logits" in str(info.value)

    def test_only_missing_dependencies_is_3(self):
        verdict = _verdict(PASS, NODEP)
        assert verdict.exit_code == 3
        with pytest.raises(MissingDependencyError):
            verdict.raise_for_status()
        assert _verdict(NODEP, ("other", "run", "error", 2)).exit_code == 2

    def test_no_checks_is_an_error(self):
        assert Verdict("ref", [], []).exit_code == 2


class TestFiles:
    def test_junit_counts_and_messages(self, tmp_path):
        verdict = _verdict(PASS, FAIL, FAIL_UQ, ERROR)
        paths = verdict.write(tmp_path)
        xml = JUnitXml.fromfile(str(paths["junit"]))
        cases = [(suite.name, case) for suite in xml for case in suite]
        assert len(cases) == 4
        failures = [c for _, c in cases if any(isinstance(r, Failure) for r in c.result)]
        errors = [c for _, c in cases if any(isinstance(r, Error) for r in c.result)]
        assert len(failures) == 2 and len(errors) == 1
        by_name = {(c.classname, c.name): c for _, c in cases}
        logits = by_name[("parity.ort_fp16", "numeric/logits")]
        assert "max|c-r| 0.25 > 0.1" in logits.result[0].message
        assert ("parity.trt", "uq/auroc_msp") in by_name and ("parity.trt-missing", "run") in by_name
        suites = {s.name: s for s in xml}
        assert suites["parity.ort_fp16"].tests == 2 and suites["parity.ort_fp16"].failures == 1
        root = ET.parse(paths["junit"]).getroot()  # plain xml.etree parses it too
        assert root.tag == "testsuites" and root.get("tests") == "4" and root.get("failures") == "2"
        assert root.get("errors") == "1"
        assert len(root.findall("./testsuite/testcase")) == 4

    def test_json_report_is_strict_json_with_every_number(self, tmp_path):
        verdict = _verdict(PASS, FAIL)
        path = verdict.write(tmp_path)["report"]

        def no_constants(name):
            raise AssertionError(f"non-standard JSON constant {name}")

        report = json.loads(path.read_text(), parse_constant=no_constants)
        assert report["schema"] == SCHEMA and report["exit_code"] == 1 and report["status"] == "fail"
        assert report["summary"] == {"checks": 2, "passed": 1, "failed": 1, "errors": 0, "unresolved": 0}
        check = report["engines"]["ort.fp16"]["checks"][1]
        assert check["data"] == {"value": 0.25, "limit": 0.1, "nan": "NaN"}
        assert check["status"] == "fail" and check["kind"] == "numeric"

    def test_markdown_summary(self, tmp_path):
        text = _verdict(PASS, FAIL, ERROR).write(tmp_path)["summary"].read_text()
        assert text.startswith("## Parity: ERROR (exit 2)")
        assert "| ort.fp16 | fp16 | - | 1/2 | - | **FAIL** |" in text
        assert "`numeric/logits` (fail)" in text and "`run` (error)" in text

    def test_writes_are_atomic_and_overwrite(self, tmp_path):
        _verdict(FAIL).write(tmp_path)
        _verdict(PASS).write(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.json", "summary.md"]
        assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 0

    def test_control_characters_do_not_break_the_xml(self, tmp_path):
        verdict = Verdict("ref", ["e"], [Check("e", "run", "error", "bad \x00\x1b byte", {}, 0.0, 2)])
        ET.parse(verdict.write(tmp_path)["junit"])
