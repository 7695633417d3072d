#!/usr/bin/env bash
# The compose stack's secrets (deploy/compose.yaml), made once into deploy/secrets/ (kept out of git;
# SECRETS_DIR names another folder, as compose.yaml reads it):
# the admin key, PostgreSQL's password and the database URL that carries it, and the S3 store's keys
# (moto, the stack's store, takes any: for your own S3, write its keys into s3_access_key_id and
# s3_secret_access_key). Existing files are kept.
# Each file is readable by the containers' users (modelhost runs as uid 10001, PostgreSQL as its own),
# which see only the file itself; the folder is its owner's alone (0700).
set -euo pipefail
cd "$(dirname "$0")"
dir="${SECRETS_DIR:-secrets}"
mkdir -p "$dir"
chmod 700 "$dir"
token() { head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32; }
write() {  # name value
    [ -s "$dir/$1" ] && return
    printf '%s' "$2" > "$dir/$1"
    chmod 644 "$dir/$1"
    echo "==> wrote $dir/$1"
}
write admin_key "mh-admin-$(token)"
write postgres_password "$(token)"
write database_url "postgresql+psycopg://modelhost:$(cat "$dir/postgres_password")@${MODELHOST_COMPOSE_DB_HOST:-postgres}:${MODELHOST_COMPOSE_DB_PORT:-5432}/modelhost"
write s3_access_key_id "modelhost"
write s3_secret_access_key "$(token)"
echo "==> the admin key is in $dir/admin_key"
