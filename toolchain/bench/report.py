"""The bench report: JSON with every sample, a Markdown table, a PNG plot and the machine.

:func:`write_report` writes ``<stem>.json`` (the whole result of
:func:`~toolchain.bench.suite.run_bench`), ``<stem>.md`` (:func:`markdown_report`) and
``<stem>.png`` (:func:`plot_report`: latency against batch size per variant with p10-p90 bars,
and the per-round ratios as bars next to the analytic FLOPs ratio) into one folder, atomically.
"""

from __future__ import annotations

import io
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from toolchain.artifacts import atomic_write_bytes, atomic_write_json, atomic_write_text
from toolchain.bench.roofline import variant_cost_key

_LIBRARIES = ("onnxruntime", "onnxruntime-gpu", "openvino", "onnx", "torch", "numpy", "transformers", "tensorrt")


# ---------------------------------------------------------------------------------- machine
def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # no /proc (not Linux) or not readable
        return ""


def _cpu_flags(cpuinfo: str) -> list[str]:
    """The vector-extension flags of /proc/cpuinfo's text (SSE, AVX, AMX, FMA, F16C); [] where it has none."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return sorted(f for f in flags if f.startswith(("sse", "ssse", "avx", "amx", "fma", "f16c")))
    return []


def cpu_id(cpuinfo: str) -> str | None:
    """``x86 family F model M`` from the text of /proc/cpuinfo; None where it has no such lines (not x86).

    It tells CPU generations apart where the brand string does not: a hypervisor may show
    ``AMD EPYC`` for a Zen 3 (family 25 model 1) and a Zen 4 (family 25 model 17) alike.
    """
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("cpu family", "model") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
        if not line.strip() and fields:  # the first processor's block is enough
            break
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"x86 family {fields['cpu family']} model {fields['model']}"


def vector_isa(flags: Iterable[str]) -> str | None:
    """The widest x86 vector extension in ``flags`` (/proc/cpuinfo names) and its low-precision parts.

    ``AVX2``, ``AVX-512``, ``AVX-512 BF16``, ``AVX-512 BF16/FP16, AMX BF16/FP16`` ..., ``no AVX`` (an
    x86 CPU with SSE only); None where no flags are known (a non-x86 machine, no /proc). The
    BF16/FP16 parts decide what OpenVINO's CPU plugin runs in BF16/FP16; the width moves every FP32
    kernel, so latency and run times of two machines compare only at the same label.
    """
    have = set(flags)
    if not have:
        return None
    if "avx512f" in have:
        low = [name for flag, name in (("avx512_bf16", "BF16"), ("avx512_fp16", "FP16")) if flag in have]
        label = "AVX-512" + (f" {'/'.join(low)}" if low else "")
    else:
        label = next((name for flag, name in (("avx2", "AVX2"), ("avx", "AVX")) if flag in have), "no AVX")
    amx = [name for flag, name in (("amx_bf16", "BF16"), ("amx_fp16", "FP16")) if flag in have]
    return label + (f", AMX {'/'.join(amx)}" if amx else "")


def _memory_total() -> int | None:
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def machine_info(threads: int | None = None) -> dict[str, Any]:
    """Processor, cores, memory, load and library versions (JSON-able)."""
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    cpuinfo = _cpuinfo()  # read once: model name, family/model and flags
    info: dict[str, Any] = {
        "processor": _cpu_model(cpuinfo),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "logical_cores": os.cpu_count(),
        "usable_cores": affinity,
        "cpu_id": cpu_id(cpuinfo),
        "cpu_flags": _cpu_flags(cpuinfo),
        "memory_bytes": _memory_total(),
        "threads": threads,
        "loadavg_start": load,
        "versions": versions,
    }
    from toolchain.engines.onnxrt import available_providers

    providers = available_providers()
    if providers is not None:
        info["onnxruntime_providers"] = providers
    return info


def machine_line(machine: Mapping[str, Any]) -> str:
    """One Markdown line describing the machine."""
    v = machine.get("versions", {})
    libs = ", ".join(f"{k} {v[k]}" for k in ("onnxruntime", "openvino", "torch", "numpy", "onnx") if k in v)
    load = machine.get("loadavg_start")
    isa = vector_isa(machine.get("cpu_flags") or [])
    cpu = ", ".join(str(x) for x in (machine.get("cpu_id"), isa) if x)
    return (f"{machine.get('processor')}{f' ({cpu})' if cpu else ''}, {machine.get('usable_cores')} usable cores, "
            f"{machine.get('threads')} threads; {libs}; load average at start {load}, "
            f"at end {machine.get('loadavg_end')}")


# --------------------------------------------------------------------------------- markdown
def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f}"


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def _ratio_cell(ratios: Mapping[str, Any], key: str) -> str:
    r = ratios.get(key)
    return "-" if r is None else f"{r['median']:.2f} [{r['p10']:.2f}, {r['p90']:.2f}]"


def latency_table(result: Mapping[str, Any]) -> str:
    """Markdown: one row per engine, batch and variant.

    Columns: median, p90, p99, min, spread, throughput, the per-round ratios against the single
    model and the deep ensemble (median with p10 and p90), the roofline ratio.
    """
    rows = ["| engine | batch | variant | median ms | p90 ms | p99 ms | min ms | spread | samples/s | "
            "/ single (p10, p90) | / deep ensemble (p10, p90) | roofline x |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case in result.get("cases", []):
        for name, v in case["variants"].items():
            suffix = name[len(name.split(".")[0]):]
            single = f"{name}/single{suffix}" if name != f"single{suffix}" else ""
            ensemble = f"{name}/deep-ensemble{suffix}" if name.startswith("hydra") else ""
            roof = case.get("roofline", {}).get(name)
            cells = [case["engine"], str(case["batch"]), name, _ms(v["median"]), _ms(v["p90"]), _ms(v["p99"]),
                     _ms(v["min"]), f"{v['spread']:.2f}", f"{v['throughput']:.1f}",
                     _ratio_cell(case["ratios"], single) if single else "1",
                     _ratio_cell(case["ratios"], ensemble) if ensemble else "-",
                     f"{roof['ratio']:.2f} ({roof['regime']})" if roof else "-"]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def ratio_table(result: Mapping[str, Any]) -> str:
    """Markdown: each per-round ratio (median, p10, p90, spread) next to the analytic ratios."""
    rows = ["| engine | batch | ratio | median | p10 | p90 | spread | ratio of medians | analytic FLOPs | "
            "analytic weight bytes |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case in result.get("cases", []):
        analytic = case.get("analytic_ratios", {})
        for key, r in case["ratios"].items():
            num, den = key.split("/")
            a = None
            if num.startswith("hydra") and "." not in num:
                a = analytic.get("hydra") if den == "single" else analytic.get("hydra_vs_deep_ensemble")
            elif key == "deep-ensemble/single":
                a = analytic.get("deep_ensemble")
            flops = f"{a['flops']:.2f}" if a else "-"
            wbytes = f"{a['weight_bytes']:.2f}" if a else "-"
            rows.append(f"| {case['engine']} | {case['batch']} | {key} | {r['median']:.3f} | {r['p10']:.3f} | "
                        f"{r['p90']:.3f} | {r['spread']:.3f} | {r['ratio_of_medians']:.3f} | {flops} | {wbytes} |")
    return "\n".join(rows)


def size_table(result: Mapping[str, Any]) -> str:
    """Markdown: files on disk, stored weights, analytic weight bytes and load memory per variant."""
    analytic = (result.get("analytic") or {}).get("by_precision", {})
    rows = ["| engine | variant | graphs | on disk MB | initializers MB | analytic weights MB | load RSS MB |",
            "|---|---|---|---:|---:|---:|---:|"]
    for kind, info in result.get("engines", {}).items():
        if info.get("status") != "ok":
            continue
        graphs = {**result.get("graphs", {}), **info.get("files", {})}  # the files this kind runs (engines, graphs)
        for name, v in info["variants"].items():
            files = list(dict.fromkeys(v["graphs"]))
            disk = sum(graphs[g]["footprint"]["total_bytes"] for g in files)
            inits = sum(graphs[g]["footprint"].get("initializer_bytes", 0) for g in files)
            precision = graphs[files[0]].get("precision") or "fp32"
            costs = next(iter(analytic.get(precision, {}).values()), None)
            ck = variant_cost_key(name)
            weights = costs[ck]["weight_bytes"] if costs and ck in costs else None
            rows.append(f"| {kind} | {name} | {', '.join(files)} | {_mb(disk)} | {_mb(inits)} | {_mb(weights)} | "
                        f"{_mb(v.get('load_rss_bytes'))} |")
    return "\n".join(rows)


def cross_table(result: Mapping[str, Any]) -> str:
    """Markdown: per-round ratios of variants on different engines (measured in the same rounds)."""
    rows = ["| batch | ratio | median | p10 | p90 |", "|---:|---|---:|---:|---:|"]
    for case in result.get("cross_ratios") or []:
        for k, r in case["ratios"].items():
            rows.append(f"| {case['batch']} | {k} | {r['median']:.3f} | {r['p10']:.3f} | {r['p90']:.3f} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def throughput_table(result: Mapping[str, Any]) -> str:
    """Markdown: rows per second on real rows per engine and variant, with the per-round ratios."""
    t = result.get("throughput")
    if not t:
        return ""
    rows = ["| engine | variant | rows/s | pass s (median) | spread | / single (p10, p90) | "
            "/ deep ensemble (p10, p90) |", "|---|---|---:|---:|---:|---:|---:|"]
    for kind, variants in t["engines"].items():
        ratios = t["ratios"].get(kind, {})
        for name, v in variants.items():
            suffix = name[len(name.split(".")[0]):]
            single = f"{name}/single{suffix}" if not name.startswith("single") else ""
            ensemble = f"{name}/deep-ensemble{suffix}" if name.startswith("hydra") else ""
            rows.append(f"| {kind} | {name} | {v['rows_per_s']:.1f} | {v['median']:.3f} | {v['spread']:.2f} | "
                        f"{_ratio_cell(ratios, single) if single else '1'} | "
                        f"{_ratio_cell(ratios, ensemble) if ensemble else '-'} |")
    return "\n".join(rows)


def _rounds_text(rounds: Any) -> str:
    if isinstance(rounds, Mapping):
        values = set(rounds.values())
        if len(values) == 1:
            return str(values.pop())
        return "(" + ", ".join(f"batch {b}: {n}" for b, n in rounds.items()) + ")"
    return str(rounds)


def markdown_report(result: Mapping[str, Any], title: str | None = None) -> str:
    """The whole Markdown report (settings, machine, tables, skipped engines, roofline peaks)."""
    s = result.get("settings", {})
    shape = f"sequence {s.get('sequence_length')}" if s.get("modality") == "text" else "image inputs"
    lines = [f"## {title}" if title else "", "",
             f"Batch sizes {s.get('batch_sizes')}, {shape}, {s.get('threads')} threads, {s.get('warmup')} warm-up "
             f"passes, {_rounds_text(s.get('rounds'))} interleaved rounds per case (every variant once per round, "
             "in the order listed); latency statistics over rounds, ratios taken per round then summarised.", "",
             f"Machine: {machine_line(result.get('machine', {}))}.", ""]
    for kind, info in result.get("engines", {}).items():
        if info.get("status") != "ok":
            lines.append(f"- {kind}: skipped ({info.get('reason')})")
        for variant, why in (info.get("skipped_variants") or {}).items():
            lines.append(f"- {kind} {variant}: skipped ({why})")
    lines += ["", "### Latency", "", latency_table(result), "", "### Ratios (per round)", "", ratio_table(result)]
    cross = cross_table(result)
    if cross:
        lines += ["", "### Across engines (per round, same rounds)", "", cross]
    t = result.get("throughput")
    if t:
        lines += ["", f"### Rows per second on real rows ({t['rows']} rows in {t['batches']} token-length batches of "
                  f"up to {t['batch_size']}, {t['rounds']} interleaved passes)", "", throughput_table(result)]
    lines += ["", "### Size and memory", "", size_table(result), ""]
    mem = result.get("memory", {})
    if mem:
        lines.append(f"Process peak RSS (high-water mark): {_mb(mem.get('end', {}).get('peak_rss_bytes'))} MB.")
    peaks = result.get("peaks")
    if peaks:
        lines += ["", f"Roofline peaks ({peaks['source']}): {peaks['flops_per_s'] / 1e9:.1f} GFLOP/s, "
                  f"{peaks['bytes_per_s'] / 1e9:.1f} GB/s (ridge {peaks['ridge_flops_per_byte']:.1f} FLOP/byte); "
                  "roofline x = measured / max(analytic FLOPs / peak, streamed weight bytes / bandwidth), the "
                  "streamed bytes being the stored weights less the input stages' embedding tables."]
    note = (result.get("analytic") or {}).get("note")
    if note:
        lines += ["", f"Analytic costs: {note}."]
    return "\n".join(lines).strip() + "\n"


# ------------------------------------------------------------------------------------- plot
def _series(result: Mapping[str, Any]) -> dict[str, dict[int, Mapping[str, Any]]]:
    out: dict[str, dict[int, Mapping[str, Any]]] = {}
    for case in result.get("cases", []):
        for name, v in case["variants"].items():
            out.setdefault(f"{case['engine']}:{name}", {})[int(case["batch"])] = v
    return out


def plot_report(result: Mapping[str, Any], path: Path | None = None, title: str | None = None) -> bytes:
    """PNG: latency vs batch size per variant (median, p10-p90 bars) and per-round ratio bars.

    Returns the PNG bytes (also written atomically to ``path`` when given).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_ratio) = plt.subplots(1, 2, figsize=(12, 4.6))
    for label, by_batch in _series(result).items():
        batches = sorted(by_batch)
        med = [1e3 * by_batch[b]["median"] for b in batches]
        lo = [m - 1e3 * by_batch[b]["p10"] for b, m in zip(batches, med)]
        hi = [1e3 * by_batch[b]["p90"] - m for b, m in zip(batches, med)]
        ax_lat.errorbar(batches, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
    ax_lat.set_xscale("log", base=2)
    ax_lat.set_yscale("log")
    ax_lat.set_xlabel("batch size")
    ax_lat.set_ylabel("latency, ms (median, p10-p90)")
    ax_lat.set_title("latency per variant")
    ax_lat.grid(True, which="both", alpha=0.3)
    ax_lat.legend(fontsize=7)
    bars: list[tuple[str, Mapping[str, Any], float | None]] = []
    for case in result.get("cases", []):
        analytic = case.get("analytic_ratios", {})
        for key, r in case["ratios"].items():
            num, den = key.split("/")
            a = None
            if num.startswith("hydra") and "." not in num:
                a = analytic.get("hydra" if den == "single" else "hydra_vs_deep_ensemble", {}).get("flops")
            elif key == "deep-ensemble/single":
                a = analytic.get("deep_ensemble", {}).get("flops")
            bars.append((f"{case['engine']} b{case['batch']}\n{key}", r, a))
    xs = range(len(bars))
    meds = [r["median"] for _, r, _ in bars]
    err = [[m - r["p10"] for (_, r, _), m in zip(bars, meds)], [r["p90"] - m for (_, r, _), m in zip(bars, meds)]]
    ax_ratio.bar(xs, meds, yerr=err, capsize=3, color="tab:blue", alpha=0.8, label="measured (median, p10-p90)")
    for x, (_, _, a) in zip(xs, bars):
        if a is not None:
            ax_ratio.hlines(a, x - 0.4, x + 0.4, colors="tab:red", linewidth=2,
                            label="analytic FLOPs ratio" if x == next(i for i, b in enumerate(bars) if b[2]) else None)
    ax_ratio.axhline(1.0, color="grey", linewidth=0.8)
    ax_ratio.set_xticks(list(xs))
    ax_ratio.set_xticklabels([b[0] for b in bars], rotation=70, fontsize=6)
    ax_ratio.set_ylabel("latency ratio (per round)")
    ax_ratio.set_title("ratios")
    if bars:
        ax_ratio.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    data = buf.getvalue()
    if path is not None:
        atomic_write_bytes(Path(path), data)
    return data


def write_report(result: Mapping[str, Any], out_dir: Path, *, stem: str = "latency",
                 title: str | None = None, extra_markdown: Sequence[str] = ()) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    plot_report(result, paths["png"], title=title)
    md = markdown_report(result, title)
    if extra_markdown:
        md += "\n" + "\n\n".join(extra_markdown).strip() + "\n"
    md += f"\n![latency]({paths['png'].name})\n"
    atomic_write_text(paths["md"], md)
    atomic_write_json(paths["json"], {**result, "files": {k: str(v) for k, v in paths.items()}})
    return paths
