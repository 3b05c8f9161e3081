#!/usr/bin/env bash
# Move constraints.txt to the newest releases, and keep them only if the test suite passes with them.
#
#   bash scripts/refresh-constraints.sh [PYTEST ARGS...]
#
# 1. a fresh virtual environment (.venv-refresh) made by scripts/setup.sh with no constraints:
#    torch==2.13.0 first (pinned there, as always), then the newest release of every other dependency;
# 2. its exact versions (pip freeze, without the package itself) go to constraints.new.txt;
# 3. the full test suite runs in it (default arguments: -x -q -p no:cacheprovider -n 2 --dist worksteal);
# 4. on a pass, constraints.new.txt replaces constraints.txt (commit it; scripts/setup.sh then
#    reinstalls .venv with those versions); on a failure constraints.txt stays as it is, and
#    constraints.new.txt and the diff show what moved. Exit status: the suite's.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv-refresh"
NEW="$ROOT/constraints.new.txt"

rm -rf "$VENV"
HYDRA_VENV="$VENV" HYDRA_CONSTRAINTS="" bash scripts/setup.sh
{
  echo "# Exact versions the test suite passed with: scripts/setup.sh installs them (pip install -c constraints.txt)."
  echo "# Written by scripts/refresh-constraints.sh (newest releases, then the full suite); do not edit by hand."
  echo "# $("$VENV/bin/python" --version), $(uname -m); local version labels dropped (torch's +cpu)."
  "$VENV/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
    | grep -v '^hydra-toolchain' | sed -E 's/^([^=]+==[^+]+)\+.*$/\1/' | LC_ALL=C sort -f
} > "$NEW"
echo "[refresh] $(grep -vc '^#' "$NEW") pinned packages in $NEW; changes against constraints.txt:"
diff <(grep -v '^#' constraints.txt 2>/dev/null || true) <(grep -v '^#' "$NEW") || true

ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-x -q -p no:cacheprovider -n 2 --dist worksteal)
start=$(date +%s)
set +e
"$VENV/bin/python" -m pytest "${ARGS[@]}"
status=$?
set -e
echo "[refresh] the suite took $(( $(date +%s) - start )) s and exited $status"
if [ "$status" -eq 0 ]; then
  mv "$NEW" constraints.txt
  echo "[refresh] constraints.txt updated: commit it, then 'bash scripts/setup.sh' installs those versions in .venv"
else
  echo "[refresh] the suite failed with the newest releases: constraints.txt is unchanged; see $NEW" >&2
fi
exit "$status"
