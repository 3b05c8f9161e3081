#!/usr/bin/env bash
# GPU latency benchmark (PyTorch + CUDA only): bash scripts/gpu-check.sh [OUT_DIR=gpu-results] [run.py options]; PYTHON overrides python3.
out="${1:-gpu-results}"; shift || true; exec "${PYTHON:-python3}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/benchmarks/gpu/run.py" --out "$out" "$@"
