#!/usr/bin/env bash
# Installs what the generated-clients test (tests/dashboard.rs) needs, only where it is missing
# or out of date: openapi-typescript, openapi-fetch, typescript and @types/node in
# tests/clients/node_modules (from the committed package-lock.json), and openapi-python-client
# with httpx and attrs in the virtualenv tests/clients/.venv (from requirements.txt). Quiet and
# quick when everything is present. Called from .ci/run; also fine by hand:
# `bash tests/clients/ci-setup.sh`.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "clients: node and npm are required (Node.js >= 20) and were not found" >&2
  exit 1
fi
if ! command -v python3 >/dev/null; then
  echo "clients: python3 is required (3.11 or later, with venv) and was not found" >&2
  exit 1
fi

# Each install records the digest of the file it installed from; a changed pin reinstalls.
digest() { sha256sum "$1" | cut -d' ' -f1; }

want=$(digest package-lock.json)
if [ "$(cat node_modules/.installed-from 2>/dev/null || true)" != "$want" ]; then
  echo "clients: npm ci (openapi-typescript, openapi-fetch, typescript)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  echo "$want" >node_modules/.installed-from
fi

want=$(digest requirements.txt)
if [ "$(cat .venv/.installed-from 2>/dev/null || true)" != "$want" ]; then
  echo "clients: pip install -r requirements.txt into tests/clients/.venv (openapi-python-client)"
  python3 -m venv --clear .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
  echo "$want" >.venv/.installed-from
fi
