package snapshot

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/topics"
)

const (
	namespace = "streamlimit"
	subsystem = "snapshot"
)

type metrics struct {
	applied    prometheus.Counter
	tombstones prometheus.Counter
	heartbeats prometheus.Counter
	ignored    prometheus.Counter
	badVec     *prometheus.CounterVec
	evicted    prometheus.Counter
	refused    prometheus.Counter
	ready      prometheus.Gauge
	// siteConflicts is the number of sites the aggregators report announced by instances
	// that count apart.
	siteConflicts prometheus.Gauge
}

func (m *metrics) bad(reason string) { m.badVec.WithLabelValues(reason).Inc() }

func newMetrics(s *Snapshot, reg prometheus.Registerer) (*metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts(opts(name, help)))
	}
	m := &metrics{
		applied:    counter("records_applied_total", "Count records applied to the snapshot."),
		tombstones: counter("tombstones_total", "Tombstones applied (keys and heartbeat sources deleted)."),
		heartbeats: counter("heartbeats_total", "Aggregator heartbeats applied."),
		ignored:    counter("ignored_records_total", "Records with a reserved key that the snapshot does not know, skipped."),
		badVec: prometheus.NewCounterVec(prometheus.CounterOpts(opts("bad_records_total",
			"Records skipped because they did not decode or named another key, by reason.")), []string{"reason"}),
		evicted: counter("evicted_total", "Entries removed by the idle sweep because their window had passed."),
		refused: counter("refused_keys_total", "Counts for new keys refused because the snapshot held MaxKeys keys or MaxBytes bytes."),
		ready:   prometheus.NewGauge(prometheus.GaugeOpts(opts("ready", "1 once the snapshot has caught up with the counts topic, else 0."))),
		siteConflicts: prometheus.NewGauge(prometheus.GaugeOpts(opts("site_conflicts",
			"Sites the aggregators report announced by several instances that count apart."))),
	}
	for _, r := range append(topics.Reasons(), ReasonKeyMismatch, ReasonSubBuckets, ReasonTooFarFuture, ReasonBadTotal, ReasonUnknownInstance) {
		m.badVec.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{
		m.applied, m.tombstones, m.heartbeats, m.ignored, m.badVec, m.evicted, m.refused, m.ready, m.siteConflicts,
		&siteCollector{s: s, age: prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "site_age_seconds"),
			"How old the snapshot's view of each live site is: now minus the time up to which its hits have been counted (a silent site's age grows; a site that left is not listed).",
			[]string{"site"}, nil),
			left: prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "site_left"),
				"1 for each site that stopped cleanly (a leave record on every partition) and is still remembered; nothing is reserved for it.",
				[]string{"site"}, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("keys", "Counter keys held.")),
			func() float64 { return float64(s.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("bytes", "Bytes the counter keys' entries keep alive, by the estimate Config.MaxBytes bounds.")),
			func() float64 { return float64(s.Bytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("age_seconds",
			"Age of the snapshot's counts: now minus the oldest source's latest heartbeat (since start when none).")),
			func() float64 { return s.Age().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("stale", "1 while the snapshot is stale (too old or a source is replaying), else 0.")),
			func() float64 { return b2f(s.Stale()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("clock_ahead_seconds",
			"How far this process's clock is at least ahead of the aggregators', from their heartbeats of the last 30 s (0: within the pipeline's lag).")),
			func() float64 { a, _ := s.ClockSkew(); return a.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("clock_behind_seconds",
			"How far this process's clock is at least behind the aggregators', from their heartbeats of the last 30 s (0: within the pipeline's lag).")),
			func() float64 { _, b := s.ClockSkew(); return b.Seconds() }),
		newSourceCollector(s),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("snapshot: register metrics: %w", err)
		}
	}
	return m, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// sourceCollector reports per-source freshness at scrape time, so that a retired source's
// series disappear with it.
type sourceCollector struct {
	s                *Snapshot
	age, lag, replay *prometheus.Desc
}

func newSourceCollector(s *Snapshot) *sourceCollector {
	labels := []string{"topic", "partition"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
	}
	return &sourceCollector{
		s:      s,
		age:    desc("source_age_seconds", "Age of the latest aggregator heartbeat for a source hits partition."),
		lag:    desc("source_lag_records", "Aggregator consume lag on a source hits partition (high watermark minus offset), from its latest heartbeat."),
		replay: desc("source_replaying", "1 while the aggregator replays a source hits partition, else 0."),
	}
}

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.age
	ch <- c.lag
	ch <- c.replay
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.s.Sources(c.s.cfg.Clock.Now()) {
		p := strconv.FormatInt(int64(src.Partition), 10)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, src.Age.Seconds(), src.Topic, p)
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(src.Lag), src.Topic, p)
		ch <- prometheus.MustNewConstMetric(c.replay, prometheus.GaugeValue, b2f(src.Replaying), src.Topic, p)
	}
}

// siteCollector reports each live site's freshness age at scrape time, and the sites that
// left.
type siteCollector struct {
	s         *Snapshot
	age, left *prometheus.Desc
}

func (c *siteCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.age; ch <- c.left }

func (c *siteCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.s.cfg.Clock.Now().UnixMilli()
	for _, st := range c.s.SiteTimes().Sites() {
		if st.Left {
			ch <- prometheus.MustNewConstMetric(c.left, prometheus.GaugeValue, 1, st.Site)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, float64(now-st.Heard)/1000, st.Site)
	}
}
