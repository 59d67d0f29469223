# streamlimit developer targets. `make test` is what CI runs (.ci/run).
#
# Real Apache Kafka (KRaft) and Redis run on loopback for the duration of
# `test-e2e` and `bench`, started and always stopped by
# e2e/services/with-services.sh. The first run fetches Kafka's jars with
# Maven (cached in ~/.m2 and ~/.cache/streamlimit) and needs java, mvn,
# kcat, python3 and redis-server (the scripts apt-get what is missing when
# run as root); examples/install-test-tools.sh adds confluent-kafka (PyPI)
# and promtool (Debian's prometheus) for the tests of examples/ and deploy/,
# Debian's chromium for the console's browser test, and Debian's nginx-light, in which
# the docs' nginx blocks run.

SHELL := /bin/bash
GO ?= go
SERVICES := e2e/services
TEST_TIMEOUT ?= 30m
# Extra flags for go test, e.g. make test TESTFLAGS=-failfast. The tiers choose the
# tests themselves; to run one test, see docs/testing.md.
TESTFLAGS ?=

.PHONY: all test test-unit test-e2e test-short lint bench fmt vet services-up services-down image disk-check

all: test

# Two tiers, each run once, with one purpose each (docs/testing.md):
#
#   test-unit  the deterministic tier: -short, which means no external process (the
#              race-free tests without -race, the rest with it). Nothing
#              here needs Kafka, Redis or a tool; a test that does skips through
#              testenv.RealParts, and internal/testtier writes its name to REAL_PARTS.
#   test-e2e   the real-parts tier: exactly the tests the unit tier listed, with real
#              Kafka and Redis (e2e/services/with-services.sh) and the tools of
#              examples/install-test-tools.sh, without -short. No unit test runs twice.
#
# `make test` (what CI runs, .ci/run) is disk-check and lint, then test-unit, then test-e2e.
test: disk-check lint
	$(MAKE) test-unit
	$(MAKE) test-e2e

# The tests of the real-parts tier, written by test-unit and read by test-e2e: those of
# the -race pass, and those of the race-free pass (run without -race there too).
REAL_PARTS ?= .tiers/real-parts.txt
REAL_PARTS_RACE_FREE ?= .tiers/real-parts-race-free.txt
TESTTIER := $(GO) run ./internal/testtier

# First the tests of the files that compile only without -race (//go:build !race),
# without it: allocation counts (under -race, sync.Pool drops items on purpose and the
# counts mean nothing) and the simulator's runs (one goroutine computing, where -race
# finds nothing and costs ten times the time). Then everything else, with -race.
test-unit:
	@mkdir -p $(dir $(REAL_PARTS)) $(dir $(REAL_PARTS_RACE_FREE))
	$(TESTTIER) racefree -o $(REAL_PARTS_RACE_FREE) -- -short -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS)
	set -o pipefail; $(GO) test -short -race -count=1 -json -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./... | $(TESTTIER) unit -o $(REAL_PARTS)

# The three-cluster test runs last and alone: its three brokers, MirrorMakers and six
# enforcers need both cores to keep their lag under the bound at which sites are taken as
# silent.
WAN_TEST := TestMultiClusterWAN
test-e2e:
	@test -f $(REAL_PARTS) -a -f $(REAL_PARTS_RACE_FREE) || { echo "$(REAL_PARTS) or $(REAL_PARTS_RACE_FREE) is missing: make test-unit lists the tests of this tier"; exit 1; }
	bash examples/install-test-tools.sh
	GO=$(GO) bash $(SERVICES)/with-services.sh $(TESTTIER) e2e -list $(REAL_PARTS) -racefree-list $(REAL_PARTS_RACE_FREE) -alone $(WAN_TEST) -- -race -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS)

# A run of `make test` writes test binaries to Go's build cache and to the temporary
# directory, and logs, Kafka's and Redis's data to its run directory. On a disk that fills
# midway the failure is a link's `no space left on device`, which reads like a broken
# build and wastes the run; checked first, the run says what is wrong before it starts.
# MIN_FREE_MIB is the peak of a run with an empty build cache (7 318 MiB above the disk's
# use before it), with margin; a warm cache needs less (docs/testing.md, Measured times).
MIN_FREE_MIB ?= 8192
disk-check:
	@for d in "$$($(GO) env GOCACHE)" "$${TMPDIR:-/tmp}" .; do \
	  mkdir -p "$$d" && free=$$(df -Pm "$$d" | awk 'NR==2 {print $$4}') || exit 1; \
	  if [ "$$free" -lt $(MIN_FREE_MIB) ]; then \
	    echo "disk-check: $$free MiB free on the disk of $$d; make test needs $(MIN_FREE_MIB) MiB (Go's build cache, test binaries, Kafka's logs). 'go clean -cache' empties Go's build cache."; exit 1; \
	  fi; \
	done

# staticcheck's version, fetched from the Go module proxy by go run (cached afterwards).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Commit subjects are at most 72 characters (CONTRIBUTING.md) for every commit after this
# one, the last of an older style with longer subjects.
SUBJECTS_SINCE := 00d5360

lint:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt would change these files (make fmt):"; echo "$$unformatted"; exit 1; fi
	@if git rev-parse -q --verify '$(SUBJECTS_SINCE)^{commit}' >/dev/null 2>&1; then \
	  long=$$(git log --format='%h %s' $(SUBJECTS_SINCE)..HEAD | perl -CSD -ne '/^\S+ (.*)$$/ && length($$1) > 72 && print'); \
	  if [ -n "$$long" ]; then echo "commit subjects over 72 characters (CONTRIBUTING.md):"; echo "$$long"; exit 1; fi; \
	else echo "lint: $(SUBJECTS_SINCE) is not in this checkout's history: commit subjects not checked"; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# The unit tier without -race and without the list, for a quick look while editing.
test-short:
	$(GO) test -short -count=1 $(TESTFLAGS) ./...

# Benchmarks of every package plus bench/ (check API and gRPC serving, propagation
# A → B on the real broker), with Kafka and Redis. Raw output goes to BENCH_OUT, the
# Markdown summary (medians over BENCHCOUNT runs) to docs/benchmarks.md (bench/run.sh,
# bench/summarize). About 6 minutes on 2 cores with the defaults.
BENCHTIME ?= 500ms
BENCHCOUNT ?= 3
BENCH_OUT ?= bench-results/bench-$(shell date -u +%Y-%m-%d-%H%M%S).txt

bench:
	bash $(SERVICES)/with-services.sh bash bench/run.sh $(BENCH_OUT) -benchtime $(BENCHTIME) -count $(BENCHCOUNT) -timeout $(TEST_TIMEOUT) $(TESTFLAGS)

fmt:
	gofmt -l -w .

# The container image as a tarball for docker load, ctr images import or crane push, built
# without a container engine by internal/ociimage: FROM scratch, the static binary as
# entrypoint, user 65532, the host's CA bundle. Reproducible: every time in it is
# SOURCE_DATE_EPOCH (the last commit's), so the same commit gives the same digest. IMAGE is
# the Helm chart's default image (repository streamlimit, tag its appVersion).
IMAGE ?= streamlimit:dev
IMAGE_TAR ?= streamlimit-image.tar
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image:
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) GO=$(GO) $(GO) run ./internal/ociimage -o $(IMAGE_TAR) -tag $(IMAGE) -version $(VERSION)

vet:
	$(GO) vet ./...

# Long-lived services for interactive work, in /tmp/streamlimit-services
# (or STREAMLIMIT_RUN_DIR), on free ports unless KAFKA_PORT and REDIS_PORT pin them
# (make services-up KAFKA_PORT=9092 REDIS_PORT=6379). Prints the variables to export.
KAFKA_PORT ?=
REDIS_PORT ?=
services-up:
	@k=$$(STREAMLIMIT_KAFKA_PORT=$(KAFKA_PORT) bash $(SERVICES)/kafka.sh start) && \
	  r=$$(STREAMLIMIT_REDIS_PORT=$(REDIS_PORT) bash $(SERVICES)/redis.sh start) && \
	  echo "export STREAMLIMIT_KAFKA_BROKERS=$$k STREAMLIMIT_REDIS_ADDR=$$r"

services-down:
	bash $(SERVICES)/kafka.sh stop
	bash $(SERVICES)/redis.sh stop
