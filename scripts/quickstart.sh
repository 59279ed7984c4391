#!/usr/bin/env bash
# Installs dependencies, builds tau and runs the quickstart example on the local backend.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
TAU_BUILD_TESTS=OFF TAU_BUILD_BENCH=OFF scripts/build.sh
build/bin/tau run examples/quickstart/tau.yaml
build/bin/tau describe "$(build/bin/tau list --all -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["name"])')"
