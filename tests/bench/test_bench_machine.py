"""The machine record of a bench report: which CPU generation and vector extensions timed the numbers."""

from __future__ import annotations

import pytest

from toolchain.bench.report import machine_info, machine_line, vector_isa


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


def test_this_machines_record_is_read_from_the_system():
    info = machine_info(threads=1)
    assert info["threads"] == 1 and info["usable_cores"] >= 1
    assert isinstance(info["cpu_flags"], list)
    assert info["cpu_id"] is None or info["cpu_id"].startswith("x86 family ")
    assert machine_line(info).startswith(info["processor"])
