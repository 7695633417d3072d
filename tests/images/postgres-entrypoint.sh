#!/bin/sh
# First start: a cluster whose superuser is $POSTGRES_USER (password from $POSTGRES_PASSWORD_FILE) and
# a database $POSTGRES_DB; then PostgreSQL in the foreground as the postgres user.
set -eu
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    cp "$POSTGRES_PASSWORD_FILE" /tmp/pwfile && chown postgres /tmp/pwfile
    runuser -u postgres -- initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f /tmp/pwfile
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    runuser -u postgres -- psql -q -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
    runuser -u postgres -- pg_ctl -D "$PGDATA" -w stop >/dev/null
fi
[ "${1:-}" = postgres ] && shift
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' "$@"
