"""The machine record of a bench report: which CPU generation and vector extensions timed the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolchain.bench.report import cpu_id, machine_info, machine_line, vector_isa


@pytest.mark.parametrize(("flags", "label"), [
    (["avx", "avx2", "fma", "f16c"], "AVX2"),  # e.g. AMD Zen 3: OpenVINO runs no BF16 there
    (["avx", "avx2", "avx512f", "avx512bw"], "AVX-512"),
    (["avx2", "avx512f", "avx512_bf16"], "AVX-512 BF16"),  # e.g. AMD Zen 4
    (["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile"],
     "AVX-512 BF16/FP16, AMX BF16"),  # e.g. Intel Sapphire Rapids
    (["avx"], "AVX"),
    (["sse2"], "no AVX"),
    ([], None),  # nothing known (not x86, no /proc/cpuinfo)
])
def test_vector_isa_names_the_widest_extension_and_its_low_precision_parts(flags, label):
    assert vector_isa(flags) == label


def test_the_machine_line_carries_the_cpu_generation_and_extensions():
    machine = {"processor": "AMD EPYC", "usable_cores": 2, "threads": 2, "cpu_id": "x86 family 25 model 17",
               "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "versions": {"torch": "2.13.0"}}
    assert machine_line(machine).startswith("AMD EPYC (x86 family 25 model 17, AVX-512 BF16), 2 usable cores, ")
    assert machine_line({"processor": "CPU", "usable_cores": 1}).startswith("CPU, 1 usable cores")


X86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
       "flags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\ncpu family\t: 6\nmodel\t\t: 143\n")
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n"


@pytest.mark.parametrize(("text", "expected"), [
    (X86, "x86 family 25 model 1"),  # the first processor's block
    (ARM, None),  # aarch64: no 'cpu family' line
    ("processor\t: 0\nmodel\t\t: 2.1 (pvr 004b 0201)\n", None),  # POWER: 'model' but no 'cpu family'
    ("", None),  # no /proc/cpuinfo
])
def test_cpu_id_reads_the_first_processors_family_and_model(text, expected):
    assert cpu_id(text) == expected


def test_this_machines_record_is_read_from_the_system():
    info = machine_info(threads=1)
    assert info["threads"] == 1 and info["usable_cores"] >= 1
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    assert info["cpu_id"] == cpu_id(text)
    if "cpu family" in text:  # x86: every x86-64 CPU has SSE2, so the record always has a label
        assert info["cpu_id"] and "sse2" in info["cpu_flags"] and vector_isa(info["cpu_flags"])
        assert f"({info['cpu_id']}, {vector_isa(info['cpu_flags'])})" in machine_line(info)
