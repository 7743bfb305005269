#!/bin/sh
# Prints fresh secrets for compose.yaml in the form its .env file takes:
#   (cd deploy && umask 077 && ./compose.env.sh > .env)
# Hex only: the password goes into a URL, and a token may hold no comma.
set -eu
hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
cat <<END
POSTGRES_PASSWORD=$(hex 24)
SETTLED_TOKENS=operator:$(hex 24),worker:$(hex 24),producer:$(hex 24)
GRAFANA_ADMIN_PASSWORD=$(hex 16)
END
