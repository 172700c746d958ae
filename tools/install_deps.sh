#!/usr/bin/env bash
# Installs what Deltafin builds and tests with: Debian packages (build) and
# Python packages (tests and reference tooling only; the binary never needs Python).
set -euo pipefail
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
APT_PKGS="build-essential clang pkg-config libjansson-dev libpcre2-dev libmicrohttpd-dev liburing-dev libxxhash-dev libssl-dev libcurl4-openssl-dev libpng-dev python3-pip"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "installing Debian packages:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
PY_PKGS="numpy pytest safetensors tokenizers tiktoken jinja2 gguf openai anthropic langchain-openai langgraph xxhash transformers prometheus_client huggingface_hub"
python3 -m pip install -q --disable-pip-version-check $PY_PKGS 2>&1 | grep -v 'Running pip as the' || true
