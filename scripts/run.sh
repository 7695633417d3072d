#!/usr/bin/env bash
# Install and start modelhost on the embedded defaults (SQLite + ./modelhost-data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh run
if ! grep -qs '^MODELHOST_ADMIN_KEY=' .env; then
    echo "MODELHOST_ADMIN_KEY=mh-admin-$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(24))')" >> .env
    echo "==> generated an admin key in .env"
fi
echo "==> starting modelhost with a ready demo deployment (modelhost quickstart)"
exec .venv/bin/modelhost quickstart
