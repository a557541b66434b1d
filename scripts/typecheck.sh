#!/usr/bin/env bash
# mypy cannot follow setuptools' package-dir mapping through an editable install, so lay the
# package out as it installs (capgate/, capgate/adapters, capgate/policies) with symlinks and
# check that tree.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .typecheck && mkdir -p .typecheck/capgate
cp -rs "$PWD/sdk/." .typecheck/capgate/
cp -rs "$PWD/adapters" .typecheck/capgate/adapters
cp -rs "$PWD/policies" .typecheck/capgate/policies
find .typecheck -name __pycache__ -prune -exec rm -rf {} +
MYPYPATH=.typecheck .venv/bin/python -m mypy --config-file pyproject.toml -p capgate "$@"
