#!/usr/bin/env bash
# The compose stack's secrets (deploy/compose.yaml), made once into deploy/secrets/ (kept out of git):
# the admin key, PostgreSQL's password and the database URL that carries it. Existing files are kept.
# Each file is readable by the containers' users (modelhost runs as uid 10001, PostgreSQL as its own),
# which see only the file itself; the folder is its owner's alone (0700).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p secrets
chmod 700 secrets
token() { head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32; }
write() {  # name value
    [ -s "secrets/$1" ] && return
    printf '%s' "$2" > "secrets/$1"
    chmod 644 "secrets/$1"
    echo "==> wrote deploy/secrets/$1"
}
write admin_key "mh-admin-$(token)"
write postgres_password "$(token)"
write database_url "postgresql+psycopg://modelhost:$(cat secrets/postgres_password)@${MODELHOST_COMPOSE_DB_HOST:-postgres}:${MODELHOST_COMPOSE_DB_PORT:-5432}/modelhost"
echo "==> the admin key is in deploy/secrets/admin_key"
