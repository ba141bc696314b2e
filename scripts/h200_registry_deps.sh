#!/usr/bin/env bash
# Builds the registry's pure-Python dependencies for the GPU machine's Python 3.12 (it has torch,
# numpy, scipy and pyyaml, but no Django and no network) as one tarball to carry there:
#   bash scripts/h200_registry_deps.sh [OUT.tar.gz]     (default var/carry/registry-py312.tar.gz)
# Wheels only, for CPython 3.12 manylinux x86_64, at the versions pyproject.toml pins. Django's
# message catalogs are dropped to stay far below the 64 MiB a device call carries; English and
# the per-language format modules (which Django imports) stay.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-var/carry/registry-py312.tar.gz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/pip install -q --target "$work/site" --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --implementation cp --no-deps \
  django==5.2.19 djangorestframework==3.18.3 drf-spectacular==0.30.0 \
  drf-spectacular-sidecar==2026.10.1 django-filter==26.2 celery==5.7.0 kombu==5.7.0 \
  gunicorn==27.0.1 dj-database-url==3.1.2 whitenoise==6.12.0 asgiref sqlparse billiard vine \
  amqp click click-didyoumean click-repl click-plugins python-dateutil six tzdata tzlocal \
  prompt-toolkit wcwidth uritemplate inflection jsonschema jsonschema-specifications \
  referencing rpds-py attrs packaging orjson==3.13.0
find "$work/site" -path '*/locale/*/LC_MESSAGES' -prune -exec rm -rf {} +
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$work/site/django/contrib/gis" "$work/site/bin"
mkdir -p "$(dirname "$out")"
tar -czf "$out" -C "$work/site" .
echo "$out: $(du -h "$out" | cut -f1)"
