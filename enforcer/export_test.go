package enforcer

// MaxDetailedSeries is maxDetailedSeries, for the tests of package enforcer_test.
const MaxDetailedSeries = maxDetailedSeries
