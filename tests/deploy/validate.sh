#!/usr/bin/env bash
# Checks the deployment files with the tool made for each (docs/deployment.md, "How these
# files are checked"):
#   deploy/compose.yaml          the compose-spec JSON schema (check-jsonschema) and
#                                docker-compose's own `config`; its Prometheus config with promtool
#   deploy/kubernetes/           kubernetes-validate --strict against Kubernetes 1.29 and 1.37,
#                                the manifests and what `kubectl kustomize` makes of them
#   deploy/systemd/settled.service  systemd-analyze verify and security (exposure <= 1.5)
#   deploy/proxy/nginx.conf      nginx -t with a self-signed certificate, then requests through
#                                a live nginx to a live settled (tests/deploy/proxy_smoke.py)
# How the files agree with the binary (flags, variables, ports, probes, images) is checked by
# `cargo test --test deploy`.
#
# Installs what it lacks: Debian packages, and a virtualenv with pinned PyPI packages under
# target/deploy-venv. Safe to run again. Needs the settled binary (built if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
}
missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v promtool >/dev/null || missing+=(prometheus)
command -v openssl >/dev/null || missing+=(openssl)
if (( ${#missing[@]} )); then
  echo "installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

VENV=target/deploy-venv
PINS="check-jsonschema==0.39.0 kubernetes-validate==1.37.0"
if [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$PINS" ]; then
  echo "installing $PINS into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q --disable-pip-version-check $PINS
  echo "$PINS" > "$VENV/.pins"
fi

SETTLED=${SETTLED_BIN:-target/debug/settled}
[ -n "${SETTLED_BIN:-}" ] || cargo build -q --bin settled

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "compose: compose-spec schema"
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml

step "compose: docker-compose config"
deploy/compose.env.sh > "$TMP/compose.env"
# Debian's docker-compose (1.29) predates the top-level `name`, which the schema above checks.
sed '/^name: /d' deploy/compose.yaml > "$TMP/compose.yaml"
docker-compose --project-directory deploy --env-file "$TMP/compose.env" -f "$TMP/compose.yaml" config -q
# Without its secrets it refuses to start, naming the one missing.
if out=$(env -u POSTGRES_PASSWORD -u SETTLED_TOKENS -u GRAFANA_ADMIN_PASSWORD \
    docker-compose --project-directory "$TMP" -f "$TMP/compose.yaml" config -q 2>&1); then
  echo "compose.yaml was accepted without its secrets"; exit 1
fi
grep -q "set .* in deploy/.env" <<<"$out" || { echo "unexpected refusal: $out"; exit 1; }
echo "refuses to start without its secrets"
if docker compose version >/dev/null 2>&1; then
  docker compose --env-file "$TMP/compose.env" -f deploy/compose.yaml config -q
  echo "docker compose (v2) config: ok"
fi

step "compose: Prometheus config with the shipped rules"
mkdir "$TMP/prometheus"
cp deploy/compose/prometheus.yml deploy/prometheus/settled-rules.yml "$TMP/prometheus/"
promtool check config "$TMP/prometheus/prometheus.yml"

step "kubernetes: kubernetes-validate --strict"
mapfile -t manifests < <(find deploy/kubernetes -name '*.yaml' ! -name kustomization.yaml | sort)
for dir in deploy/kubernetes/sqlite deploy/kubernetes/postgres; do
  if command -v kubectl >/dev/null; then
    kubectl kustomize "$dir" > "$TMP/$(basename "$dir").kustomized.yaml"
    manifests+=("$TMP/$(basename "$dir").kustomized.yaml")
  else
    echo "kubectl is not installed: $dir/kustomization.yaml is not built"
  fi
done
for version in 1.29.0 1.37.0; do
  "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "${manifests[@]}"
  echo "Kubernetes $version: ${#manifests[@]} files valid"
done

step "systemd: systemd-analyze verify and security"
sed "s#^ExecStart=/usr/local/bin/settled #ExecStart=$ROOT/$SETTLED #" deploy/systemd/settled.service \
  > "$TMP/settled.service"
grep -q "^ExecStart=$ROOT/$SETTLED serve" "$TMP/settled.service"
# verify exits 0 on settings it ignores: any word from it is a failure.
out=$(systemd-analyze verify "$TMP/settled.service" 2>&1) || { echo "$out"; exit 1; }
[ -z "$out" ] || { echo "$out"; exit 1; }
echo "verify: clean"
# 15 is this unit's score (1.5, "OK"): a setting loosened raises it and fails here.
systemd-analyze security --offline=yes --threshold=15 "$TMP/settled.service" | tail -n 1

step "nginx: nginx -t with a self-signed certificate"
mkdir -p "$TMP/nginx"/{tls,temp}
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=settled.example.com" \
  -addext "subjectAltName=DNS:settled.example.com,IP:127.0.0.1" \
  -keyout "$TMP/nginx/tls/settled.key" -out "$TMP/nginx/tls/settled.crt" 2>/dev/null
sed "s#/etc/nginx/tls/#$TMP/nginx/tls/#" deploy/proxy/nginx.conf > "$TMP/nginx/settled.conf"
main_conf() {
  cat <<EOF
$([ "$(id -u)" = 0 ] && echo "user root;")
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log;
events {}
http {
  access_log off;
  client_body_temp_path $TMP/nginx/temp/body;
  proxy_temp_path $TMP/nginx/temp/proxy;
  fastcgi_temp_path $TMP/nginx/temp/fastcgi;
  uwsgi_temp_path $TMP/nginx/temp/uwsgi;
  scgi_temp_path $TMP/nginx/temp/scgi;
  include $1;
}
EOF
}
main_conf "$TMP/nginx/settled.conf" > "$TMP/nginx/nginx.conf"
nginx -t -q -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx/nginx.conf"
echo "nginx -t: ok"

step "nginx: requests through it to a live settled"
free_ports() {
  python3 -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))'
}
read -r APP_PORT TLS_PORT HTTP_PORT < <(free_ports)
TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
env -u SETTLED_TOKENS -u SETTLED_LISTEN -u SETTLED_DATABASE_URL RUST_LOG=warn \
  "$SETTLED" serve --listen "127.0.0.1:$APP_PORT" --database-url "sqlite:$TMP/settled.db" \
  --token "operator:$TOKEN" --log-format json >"$TMP/settled.log" 2>&1 &
PIDS+=($!)
# The live copy: loopback ports of this run, settled's port upstream.
sed -e "s#^\(\s*\)server 127.0.0.1:8080 #\1server 127.0.0.1:$APP_PORT #" \
    -e "s#^\(\s*\)listen 443 ssl http2;#\1listen 127.0.0.1:$TLS_PORT ssl http2;#" \
    -e "s#^\(\s*\)listen 80;#\1listen 127.0.0.1:$HTTP_PORT;#" \
    -e '/listen \[::\]/d' \
    "$TMP/nginx/settled.conf" > "$TMP/nginx/live.conf"
grep -q "server 127.0.0.1:$APP_PORT " "$TMP/nginx/live.conf"
grep -q "listen 127.0.0.1:$TLS_PORT ssl" "$TMP/nginx/live.conf"
main_conf "$TMP/nginx/live.conf" > "$TMP/nginx/live-main.conf"
nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx/live-main.conf" &
PIDS+=($!)
for _ in $(seq 1 100); do
  "$SETTLED" healthcheck --listen "127.0.0.1:$APP_PORT" --timeout 1s >/dev/null 2>&1 \
    && (exec 3<>"/dev/tcp/127.0.0.1/$TLS_PORT") 2>/dev/null && break
  sleep 0.1
done
"$SETTLED" healthcheck --listen "127.0.0.1:$APP_PORT" \
  || { cat "$TMP/settled.log"; exit 1; }
python3 tests/deploy/proxy_smoke.py "https://127.0.0.1:$TLS_PORT" "http://127.0.0.1:$HTTP_PORT" \
  "$TMP/nginx/tls/settled.crt" "$TOKEN" \
  || { echo "nginx error log:"; cat "$TMP/nginx/error.log"; exit 1; }

printf '\ndeploy files: all checks passed\n'
