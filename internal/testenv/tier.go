package testenv

import "testing"

// RealPartsSkip is the skip message of RealParts. `make test-unit` lists the tests whose
// skip says it, and `make test-e2e` runs exactly those (internal/testtier), so that each
// test runs in one tier and none is left out of both.
const RealPartsSkip = "real-parts tier (make test-e2e)"

// RealParts marks t as a test of the real-parts tier: one that needs a real service
// (Kafka, Redis) or starts a process (a broker, redis-server, MirrorMaker, the built
// binary, a browser, python, java, curl, a shell). Under -short, which means "no external
// processes", it skips t. Every helper of this package that needs or starts one calls it,
// so that tests using them need nothing more; a test that starts a process on its own
// calls it before doing so.
func RealParts(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip(RealPartsSkip)
	}
}
