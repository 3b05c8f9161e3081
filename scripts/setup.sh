#!/usr/bin/env bash
# Create (once) and fill the virtual environment .venv at the repository root, with the exact
# versions of constraints.txt (the versions the test suite passed with; scripts/refresh-constraints.sh
# moves them to the newest releases). Idempotent: a second call with unchanged pyproject.toml,
# constraints.txt and this script installs nothing.
#   HYDRA_VENV=DIR         another virtual environment (default: .venv)
#   HYDRA_CONSTRAINTS=FILE another constraints file; empty: the newest releases (refresh-constraints.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${HYDRA_VENV:-$ROOT/.venv}"
CONSTRAINTS="${HYDRA_CONSTRAINTS-$ROOT/constraints.txt}"
if [ -n "$CONSTRAINTS" ] && [ ! -f "$CONSTRAINTS" ]; then
  echo "[setup] error: constraints file '$CONSTRAINTS' does not exist" >&2
  exit 2
fi
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi

# Fashion-MNIST is a Debian package; install it when we can (root + apt), else say how.
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian package dataset-fashion-mnist"
    (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 \
      || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1)) \
      || echo "[setup] warning: could not install dataset-fashion-mnist; image recipes will say so"
  else
    echo "[setup] note: Fashion-MNIST missing; run 'sudo apt-get install dataset-fashion-mnist' for image recipes"
  fi
fi

# Debian's Chromium renders report.html in the tests (tests/core/test_report_html.py); same rule.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian package chromium (headless browser for the report test)"
    (apt-get install -y -qq chromium >/dev/null 2>&1 \
      || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1)) \
      || echo "[setup] warning: could not install chromium; the browser test of report.html will be skipped"
  else
    echo "[setup] note: chromium missing; 'sudo apt-get install chromium' runs the browser test of report.html"
  fi
fi

STAMP="$VENV/.hydra-setup-stamp"
# the stamp covers what decides the installed versions: pyproject.toml, this script, the constraints
WANT=$( (cat pyproject.toml scripts/setup.sh; echo "constraints: ${CONSTRAINTS:+$(basename "$CONSTRAINTS")}";
         [ -z "$CONSTRAINTS" ] || cat "$CONSTRAINTS") | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
PIN=()
[ -z "$CONSTRAINTS" ] || PIN=(-c "$CONSTRAINTS")
# torch first, pinned: any looser spec with no torch installed pulls a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q "${PIN[@]}" "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "${PIN[@]}" -e ".[demo,dev]"
echo "$WANT" > "$STAMP"
echo "[setup] done${CONSTRAINTS:+ (versions of $(basename "$CONSTRAINTS"))}"
