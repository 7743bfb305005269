#!/usr/bin/env bash
# Installs what the SDK tests (tests/sdk/driver.rs) need, only where it is missing or out of
# date, the way a user installs the SDKs:
# - clients/python/.venv: `pip install ./clients/python` (reinstalled when the SDK's files
#   change), with mypy and PyYAML for the type check and the generator, OpenTelemetry's API and
#   SDK for the trace test (tests/sdk/traces.py), and httpx for the
#   scenario driver and the bench (tests/sdk/scenarios.py, bench/sdk/run.py);
# - clients/typescript/node_modules: typescript, openapi-typescript and @types/node, from the
#   committed package-lock.json (the built files in dist/ are committed: no build on install);
# - examples/node/node_modules: a plain `npm install`, which links the SDK's folder.
# Called from .ci/run; also fine by hand: `bash clients/ci-setup.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v node >/dev/null && command -v npm >/dev/null \
  || { echo "sdk: node and npm are required (Node.js >= 18)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "sdk: python3 (>= 3.10, with venv) is required" >&2; exit 1; }

digest() { (cd "$1" && find . \( -name .venv -o -name node_modules -o -name .mypy_cache -o -name __pycache__ \) -prune -o -type f -print \
  | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -d' ' -f1; }

want=$(digest clients/python)-$(sha256sum clients/ci-setup.sh | cut -c1-16)
venv=clients/python/.venv
if [ "$(cat $venv/.installed-from 2>/dev/null || true)" != "$want" ]; then
  echo "sdk: pip install ./clients/python (and mypy, PyYAML) into $venv"
  [ -x $venv/bin/python ] || python3 -m venv $venv
  $venv/bin/pip install --quiet --disable-pip-version-check --upgrade ./clients/python "mypy==2.4.1" "PyYAML==6.0.4" "httpx==0.28.1" \
    "opentelemetry-api==1.29.0" "opentelemetry-sdk==1.29.0"
  echo "$want" >$venv/.installed-from
fi

want=$(sha256sum clients/typescript/package-lock.json | cut -d' ' -f1)
if [ "$(cat clients/typescript/node_modules/.installed-from 2>/dev/null || true)" != "$want" ]; then
  echo "sdk: npm ci in clients/typescript (typescript, openapi-typescript)"
  (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" >clients/typescript/node_modules/.installed-from
fi

if [ ! -e examples/node/node_modules/settled/package.json ]; then
  echo "sdk: npm install in examples/node (links clients/typescript)"
  (cd examples/node && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi
