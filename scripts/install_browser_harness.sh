#!/usr/bin/env bash
# Install the pinned browser-use agent (the GUI harness k8s_jobs/browser_harness.py runs)
# into its own virtual environment, .harnesses/browser-use/venv, from
# .harnesses/browser-use/requirements.txt (every package pinned, installed --no-deps).
# Its openai SDK (3.x) is not the one Forge pins, hence a venv of its own. Chromium is
# Debian's package (.ci/run installs it); nothing else is downloaded at run time.
# About 370 MB, 20-60 s from a warm registry. Idempotent.
#
#   scripts/install_browser_harness.sh           install if missing or stale
#   scripts/install_browser_harness.sh --check   exit 0 if installed, 1 if not
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=.harnesses/browser-use
VENV=$DIR/venv
STAMP=$VENV/.forge-installed
PY=${PYTHON:-python3.11}
MODE=${1:-install}

die() { echo "install_browser_harness: $*" >&2; exit 1; }

installed_ok() {
  [ -f "$STAMP" ] && cmp -s "$STAMP" "$DIR/requirements.txt" \
    && "$VENV/bin/python" -c "import browser_use" >/dev/null 2>&1
}

case "$MODE" in
  --check) installed_ok && exit 0 || exit 1 ;;
  install) ;;
  *) die "unknown option $MODE (use --check or nothing)" ;;
esac

if installed_ok; then
  exit 0
fi
command -v "$PY" >/dev/null || die "$PY not found (browser-use needs Python >= 3.11)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# (pip's notes about index locations it cannot read are left out)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  -r "$DIR/requirements.txt" 2> >(grep -v "^WARNING: Location" >&2)
"$VENV/bin/python" -m pip check -q --disable-pip-version-check >/dev/null \
  || die "the pinned set is inconsistent: $("$VENV/bin/python" -m pip check 2>&1 | head -3)"
"$VENV/bin/python" -c "import browser_use" || die "browser_use does not import"
cp "$DIR/requirements.txt" "$STAMP"
echo "install_browser_harness: browser-use installed in $VENV"
