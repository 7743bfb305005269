#!/usr/bin/env bash
# Installs what tests/dashboard.rs needs, only where it is missing: Debian's Chromium at
# /usr/bin/chromium, and playwright-core in tests/dashboard/node_modules (from the committed
# package-lock.json). Quiet and quick when everything is present. Called from .ci/run; also
# fine by hand: `bash tests/dashboard/ci-setup.sh` (as root, or with sudo for apt-get).
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -x /usr/bin/chromium ]; then
  echo "dashboard: installing Debian chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
  /usr/bin/chromium --version
fi

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "dashboard: node and npm are required (Node.js >= 20) and were not found" >&2
  exit 1
fi

# node_modules is present and holds the locked playwright-core version: nothing to do.
want=$(node -e 'console.log(require("./package-lock.json").packages["node_modules/playwright-core"].version)')
have=$(node -e 'try { console.log(require("./node_modules/playwright-core/package.json").version) } catch { console.log("") }')
if [ "$want" != "$have" ]; then
  echo "dashboard: npm ci (playwright-core $want)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi
