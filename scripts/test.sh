#!/usr/bin/env bash
# The project's test command: installs what is missing, lints, then runs every test.
# Uses PostgreSQL and Redis on localhost when they answer (CI has both); SQLite otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The dashboard's browser tests drive Debian's chromium through Playwright (never a downloaded
# browser); install it where it is missing (CI runs as root on Debian).
if [ ! -x /usr/bin/chromium ]; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq chromium
fi
.venv/bin/ruff check .
# Formatting (and so the 100-column line length) is enforced for the whole tree.
.venv/bin/ruff format --check .
# Types: strict over every package, with the Django, DRF and Celery stubs (pyproject.toml).
.venv/bin/mypy
if [ -z "${DATABASE_URL:-}" ] && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
fi
exec .venv/bin/python -m pytest -q "$@"
