#!/usr/bin/env bash
# install-test-tools.sh — install what the tests of examples/ and deploy/ run besides Go:
# the Python client library of examples/python (from PyPI) and promtool (Debian's
# prometheus package, for deploy/prometheus/alerts.yml). Each is installed only when
# missing; `make test` runs this first. Java and Kafka's client jars come with
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
