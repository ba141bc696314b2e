#!/usr/bin/env bash
# The project's test command: installs what is missing, lints, then runs every test.
# Uses PostgreSQL and Redis on localhost when they answer (CI has both); SQLite otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
if [ -z "${DATABASE_URL:-}" ] && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
fi
exec .venv/bin/python -m pytest -q "$@"
