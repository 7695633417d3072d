#!/usr/bin/env bash
# Install and start modelhost on the embedded defaults (SQLite + ./modelhost-data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh run
if ! grep -qs '^MODELHOST_ADMIN_KEY=' .env; then
    echo "MODELHOST_ADMIN_KEY=mh-admin-$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(24))')" >> .env
    echo "==> generated an admin key in .env"
fi
admin_key="$(grep '^MODELHOST_ADMIN_KEY=' .env | tail -1 | cut -d= -f2-)"
port="${MODELHOST_PORT:-8000}"
cat <<MSG
==> starting modelhost on http://127.0.0.1:${port}  (API docs: http://127.0.0.1:${port}/docs)
    Create an account (prints its key once):
      curl -s -X POST http://127.0.0.1:${port}/v1/admin/accounts \\
        -H "Authorization: Bearer ${admin_key}" -H 'Content-Type: application/json' -d '{"name": "me", "credits": 1000}'
    or: MODELHOST_ADMIN_KEY=${admin_key} .venv/bin/modelhost accounts create me --credits 1000
MSG
exec .venv/bin/modelhost serve
