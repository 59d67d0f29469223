// Package envoycompat tests that streamlimit, with compat: envoy (--compat envoy), answers
// as envoyproxy/ratelimit answers, on the expectations of envoyproxy/ratelimit's own tests
// and against the real envoyproxy/ratelimit:
//
//   - TestReplay replays the expectations of its integration tests, its config tests, its
//     service tests (their stubbed configurations restated as rules files) and its /json
//     handler test against streamlimit's real server (package server) over gRPC
//     and /json, on its own configuration files, and counts the answers equal as whole
//     messages (as its tests compare them) and the equal codes.
//   - TestTheirConfigFiles loads each of its configuration test files as the enforcer
//     loads rules, and checks it is accepted or rejected as its tests expect.
//   - TestDifferential runs the same requests, and more (hits_addend, quota mode, the
//     response fields, empty requests), against the real envoyproxy/ratelimit, built at a
//     pinned version by the test, and against streamlimit, both on the test's Redis, and
//     compares every answer.
//   - TestLiveSwitch switches a client, half-way through its window, from the real
//     envoyproxy/ratelimit to the streamlimit binary on the same Redis and environment,
//     and back, as docs/envoy-compat.md's "Switching a running deployment" says.
//   - TestOneCounterEveryAPI spends a compat: envoy limit through the gRPC service, the
//     check API and /v1/auth of one streamlimit server, on real Redis, and checks that
//     all three count it at its one key in envoyproxy/ratelimit's layout.
//
// The expected answers are this package's own table. envoyproxy/ratelimit's configuration
// files are read at test time from its module source, which `go mod download` puts in the
// module cache at the pinned version (RatelimitVersion): nothing of it is in this
// repository. Where the module or Redis is missing the tests are skipped, or fail under
// CI=true. The package has no code of its own: everything is in its _test.go files.
package envoycompat
