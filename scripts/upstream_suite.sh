#!/usr/bin/env bash
# Runs pg-scheduler 0.2.3's own test suite, unchanged, against this checkout's
# install: its pytest suite (as its CI runs it) and its 4-process race suite.
# A manual drop-in check; not part of our pytest run or CI.
#
#   scripts/upstream_suite.sh UPSTREAM_CHECKOUT PG_BIN_DIR
#
# UPSTREAM_CHECKOUT: an exported tree of the upstream release (it needs tests/
# and pytest.ini), e.g. from a clone of m1guelvrrl0/pg-scheduler:
#   git --git-dir=CLONE/.git archive v0.2.3 | tar -x -C /tmp/upstream
# PG_BIN_DIR: a PostgreSQL bin directory (initdb, pg_ctl): the system's
# (/usr/lib/postgresql/15/bin) or pgserver's (find .venv -name initdb).
# Environment: PYTHON (default .venv/bin/python of this checkout, which needs
# pytest-cov as well, for upstream's --cov-branch), PORT (default 55432),
# RACE=0 to skip the race suite, PYTEST_ARGS (extra pytest arguments).
#
# A throwaway cluster whose bootstrap user is `scheduler` (trust auth) is made
# in a temporary directory, used and removed; nothing else is touched.
set -euo pipefail

if [ $# -ne 2 ]; then
    sed -n '2,16p' "$0" >&2
    exit 2
fi
UPSTREAM=$(realpath "$1")
PGBIN=$(realpath "$2")
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
PORT=${PORT:-55432}
RACE=${RACE:-1}

[ -x "$PGBIN/initdb" ] || { echo "no initdb in $PGBIN" >&2; exit 2; }
[ -f "$UPSTREAM/pytest.ini" ] && [ -d "$UPSTREAM/tests" ] || {
    echo "$UPSTREAM has no tests/ and pytest.ini" >&2
    exit 2
}

WORK=$(mktemp -d /tmp/upstream_suite.XXXXXX)
chmod 755 "$WORK"
DATA=$WORK/data
# initdb refuses to run as root: run the server as the postgres user then.
if [ "$(id -u)" = 0 ]; then
    as_pg() { runuser -u postgres -- "$@"; }
    mkdir "$DATA" && chown postgres "$DATA"
else
    as_pg() { "$@"; }
fi

cleanup() {
    as_pg "$PGBIN/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

as_pg "$PGBIN/initdb" -D "$DATA" -U scheduler --auth=trust >"$WORK/initdb.log" 2>&1
as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w \
    -o "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$DATA" start >/dev/null
echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on port $PORT"

export PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=scheduler PGPASSWORD=scheduler123
for db in scheduler_db race_db; do
    PGDATABASE=postgres "$PYTHON" -c "
import asyncio, asyncpg
async def main():
    conn = await asyncpg.connect()
    await conn.execute('CREATE DATABASE $db')
    await conn.close()
asyncio.run(main())"
done

# Only the tests and their config: the upstream tree's own pg_scheduler/
# package must not shadow the install under test.
SUITE=$WORK/suite
mkdir "$SUITE"
cp -r "$UPSTREAM/tests" "$UPSTREAM/pytest.ini" "$SUITE/"
cd "$SUITE"
echo "pg_scheduler under test: $("$PYTHON" -c 'import pg_scheduler; print(pg_scheduler.__file__)')"

status=0
# As upstream's CI runs it (coverage reporting left out).
PGDATABASE=scheduler_db "$PYTHON" -m pytest tests/ -v -p no:cacheprovider ${PYTEST_ARGS:-} \
    >"$WORK/pytest.log" 2>&1 || status=1
grep -E '^(FAILED|ERROR) ' "$WORK/pytest.log" || true
summary=$(tail -n 1 "$WORK/pytest.log")
echo "pytest: $summary"
pytest_passed=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)

race_passed=0
race_total=0
if [ "$RACE" = 1 ]; then
    # Upstream's docker-compose race test: four instances at once on a fresh
    # database, then its verifier. Each instance's clean exit is a check too.
    race_total=10
    pids=()
    for i in 1 2 3 4; do
        PGDATABASE=race_db SCHEDULER_INSTANCE=$i "$PYTHON" tests/race_conditions/test_multi_instance.py \
            >"$WORK/race_$i.log" 2>&1 &
        pids+=($!)
    done
    for i in 1 2 3 4; do
        if wait "${pids[$((i - 1))]}"; then
            race_passed=$((race_passed + 1))
        else
            echo "race instance $i failed:"
            tail -n 20 "$WORK/race_$i.log"
            status=1
        fi
    done
    PGDATABASE=race_db "$PYTHON" tests/race_conditions/verify_results.py >"$WORK/verify.log" 2>&1 ||
        status=1
    grep -E 'FAIL|OVERALL' "$WORK/verify.log" || true
    verified=$(grep -oE 'OVERALL: [0-9]+' "$WORK/verify.log" | grep -oE '[0-9]+' || echo 0)
    race_passed=$((race_passed + verified))
    echo "race: $race_passed/$race_total (4 instances exiting cleanly + 6 verifier checks)"
fi

collected=$(grep -oE 'collected [0-9]+ items' "$WORK/pytest.log" | grep -oE '[0-9]+' || echo 0)
echo "TOTAL: $((pytest_passed + race_passed))/$((collected + race_total))"
if [ "$status" != 0 ] && [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp "$WORK"/*.log "$KEEP_LOGS"/
    echo "logs kept in $KEEP_LOGS"
fi
exit "$status"
