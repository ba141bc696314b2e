#!/usr/bin/env bash
# Issue 6, item 5: the whole job path on the H200 machine, once: SQLite, the embedded
# (filesystem) Celery broker, the registry served by gunicorn, one GPU worker on gpu.H200, and a
# vllm-modular TP1/DP1 slice queued through the REST API (scripts/h200_jobs_e2e.py).
#
# The GPU machine has torch and (once staged) vLLM but no Django: the registry's pure-Python
# dependencies travel as a tarball built here for its Python 3.12 (docs/jobs.md, "On the H200").
# Run from the project's root on the GPU machine with the vLLM kit staged and env.sh sourced:
#   bash scripts/h200_jobs_e2e.sh DEPS.tar.gz
# $OUT receives e2e.log (the API conversation), job.json, bundle.json, lookup.json, worker.log,
# server.log and setup.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-var/h200-jobs-out}
DEPS=${1:?the registry dependencies tarball}
mkdir -p "$OUT_DIR" /tmp/registry-deps
tar -xzf "$DEPS" -C /tmp/registry-deps
export PYTHONPATH="$PWD:/tmp/registry-deps${PYTHONPATH:+:$PYTHONPATH}"
export REGISTRY_VAR_DIR=/tmp/registry-var DJANGO_DEBUG=0 PYTHONUNBUFFERED=1
export DJANGO_ALLOWED_HOSTS=127.0.0.1,localhost
rm -rf "$REGISTRY_VAR_DIR"
( set -e
  python3 --version
  python3 -c 'import django, rest_framework, celery, torch, vllm; print("django", django.__version__, "drf", rest_framework.VERSION, "celery", celery.__version__, "torch", torch.__version__, "vllm", vllm.__version__)'
  python3 manage.py migrate --noinput
  python3 -c 'from config.celery import ensure_broker_folders; ensure_broker_folders()'
) >"$OUT_DIR/setup.log" 2>&1 || { cat "$OUT_DIR/setup.log"; exit 1; }
token=$(python3 manage.py upload_token h200-operator)

python3 -m celery -A config worker --pool solo --concurrency 1 --queues gpu.H200 \
  -n gpu0@%h --loglevel INFO >"$OUT_DIR/worker.log" 2>&1 &
worker=$!
python3 -m gunicorn config.wsgi --bind 127.0.0.1:8000 --workers 2 --worker-class gthread \
  --threads 4 --access-logfile - --error-logfile - >"$OUT_DIR/server.log" 2>&1 &
server=$!
trap 'kill $worker $server 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 60); do
  curl -sf http://127.0.0.1:8000/api/v1/ >/dev/null && break
  sleep 0.5
done
python3 scripts/h200_jobs_e2e.py http://127.0.0.1:8000 "$token" "$OUT_DIR" --limit-s "${LIMIT_S:-420}"
status=$?
echo "e2e exit status $status"
tail -n 20 "$OUT_DIR/worker.log"
exit "$status"
