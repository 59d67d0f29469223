// Package envoycompat tests that streamlimit, with compat: envoy (--compat envoy), answers
// as envoyproxy/ratelimit answers, on the expectations of envoyproxy/ratelimit's own tests
// and against the real envoyproxy/ratelimit: TestReplay, TestTheirConfigFiles,
// TestDifferential, TestLiveSwitch and TestOneCounterEveryAPI. The package has no code of
// its own: everything is in its _test.go files. What each test checks, with its figures:
// docs/envoy-compat.md.
package envoycompat
