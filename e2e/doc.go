// Package e2e holds streamlimit's end-to-end tests: three data centers on one real Apache
// Kafka cluster and real Redis servers, enforcers and aggregators assembled from the
// product's packages, a load generator speaking the enforcers' HTTP check API, and the fault
// tests (Kafka down, aggregator killed, Redis down, bad records, broken rules, key flood).
//
// The package has no code of its own: everything is in its _test.go files, run by
// `make test` with the services of e2e/services. docs/e2e.md reports the figures the tests
// log, with the commands that produced them.
package e2e
