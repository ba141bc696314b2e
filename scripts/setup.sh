#!/usr/bin/env bash
# Creates .venv and installs the project with what the tests and the web service need.
# Idempotent: a second run only checks that everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  # torch first, from the CPU file this machine kind carries (a plain resolve would pull CUDA).
  .venv/bin/pip install -q "torch==2.13.0"
  .venv/bin/pip install -q -e ".[registry,acquisition,dev]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
