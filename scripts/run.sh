#!/usr/bin/env bash
# The project's run command: sets up, migrates, imports the shipped bundles and routing profiles,
# and serves the registry on http://127.0.0.1:8000 (API docs at /api/docs/). Defaults need no server:
# SQLite at var/db.sqlite3 and Celery's embedded filesystem broker under var/celery.
# Environment: DATABASE_URL, CELERY_BROKER_URL, REDIS_URL (see config/settings.py),
# REGISTRY_BIND (default 127.0.0.1:8000), REGISTRY_WEB_WORKERS (default 2), REGISTRY_WEB_THREADS
# (default 4; 1 for a lookup-heavy registry, docs/benchmarks.md),
# REGISTRY_RUN_WORKER=0 to start no Celery workers (nor beat) beside the web server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
py=.venv/bin/python
"$py" manage.py migrate --noinput
# Static files into var/static with gzip and brotli copies; the server then serves those
# (plotly.js compressed, vendored files cached for good: config/settings.py).
"$py" manage.py collectstatic --noinput --verbosity 0
export REGISTRY_COLLECTED_STATIC=1
"$py" manage.py import_bundle bundles
# The routing profiles captured on the H200 (issue 15; docs/evidence/h200-routing/README.md).
"$py" manage.py import_profile docs/evidence/h200-routing
bind=${REGISTRY_BIND:-127.0.0.1:8000}

worker_pids=()
if [ "${REGISTRY_RUN_WORKER:-1}" = "1" ]; then
  "$py" -c 'from config.celery import ensure_broker_folders; ensure_broker_folders()' \
    </dev/null
  # CPU reference acquisitions (queue cpu); a GPU host adds its own worker on gpu.<hardware>
  # (docs/jobs.md). solo: one job at a time, and a job's subprocess dies with the worker.
  .venv/bin/celery -A config worker --pool solo --concurrency 1 --queues cpu \
    -n "local@%h" --loglevel WARNING &
  worker_pids+=($!)
  # Housekeeping (queue default) with the embedded Celery beat (-B, schedule file under
  # var/celery): the orphan sweep every REGISTRY_JOB_SWEEP_S seconds. A worker of its own, so
  # that a long job never holds the sweep up and a job worker that dies is still swept.
  .venv/bin/celery -A config worker --pool solo --concurrency 1 --queues default -B \
    -n "registry@%h" --loglevel WARNING &
  worker_pids+=($!)
fi
stop() {
  local pid
  for pid in ${worker_pids[@]+"${worker_pids[@]}"}; do kill "$pid" 2>/dev/null || true; done
}
trap stop EXIT INT TERM

echo "serving the registry on http://$bind (API docs: http://$bind/api/docs/)"
.venv/bin/gunicorn config.wsgi --worker-class gthread --threads "${REGISTRY_WEB_THREADS:-4}" \
  --bind "$bind" --workers "${REGISTRY_WEB_WORKERS:-2}" \
  --access-logfile - --error-logfile - --log-level warning
