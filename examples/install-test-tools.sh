#!/usr/bin/env bash
# install-test-tools.sh — install what the tests of examples/ and deploy/ run besides Go:
# the Python client library of examples/python (from PyPI), promtool (Debian's
# prometheus package, for deploy/prometheus/alerts.yml), schemathesis (PyPI, in a
# virtual environment of its own, ~/.cache/streamlimit/venv, where
# serve/server's TestSchemathesis finds it), and Chromium (Debian's chromium package,
# which cmd/streamlimit's TestConsoleInABrowser drives headless), and nginx (Debian's nginx-light,
# in which TestNginxBlocksInRealNginx runs the docs' auth_request blocks). Each is installed only when missing;
# `make test` runs this first. Java and Kafka's client jars come with
# e2e/services/kafka.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../e2e/services/lib.sh
source "$HERE/../e2e/services/lib.sh"

need_cmd python3 python3
if ! python3 -c 'import confluent_kafka' 2>/dev/null; then
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  log "pip install -r examples/python/requirements.txt"
  python3 -m pip install -q -r "$HERE/python/requirements.txt" >&2 ||
    python3 -m pip install -q --break-system-packages -r "$HERE/python/requirements.txt" >&2 ||
    die "could not install confluent-kafka"
fi
need_cmd promtool prometheus
need_cmd chromium chromium
need_cmd nginx nginx-light
# schemathesis, pinned: a new version brings new checks, which a change of this line adopts.
SCHEMATHESIS_VERSION=4.32.5
VENV="${STREAMLIMIT_TOOLS_VENV:-$HOME/.cache/streamlimit/venv}"
if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -qF "$SCHEMATHESIS_VERSION"; then
  python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
  log "pip install schemathesis==$SCHEMATHESIS_VERSION into $VENV"
  python3 -m venv "$VENV" >&2 || die "could not make a virtual environment at $VENV"
  "$VENV/bin/python" -m pip install -q "schemathesis==$SCHEMATHESIS_VERSION" >&2 || die "could not install schemathesis"
fi
