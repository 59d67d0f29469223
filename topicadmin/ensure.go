// Package topicadmin creates and verifies streamlimit's Kafka topics with the admin API.
// It is kept apart from package topics, the record contract, so that code which only
// encodes or decodes records does not pull in a Kafka client.
package topicadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/streamlimit/streamlimit/topics"
)

// MismatchError says that an existing topic differs from what streamlimit needs.
// Ensure never alters an existing topic; the operator fixes it.
type MismatchError struct {
	Topic   string
	Setting string
	Have    string
	Want    string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("topic %q: %s is %s, want %s (streamlimit does not alter existing topics: fix it with kafka-configs/kafka-topics or recreate it)",
		e.Topic, e.Setting, e.Have, e.Want)
}

// EnsureResult says what Ensure did with each topic.
type EnsureResult struct {
	// Created lists the topics that Ensure created.
	Created []string
	// Verified lists the existing topics that matched the configuration.
	Verified []string
}

// ReadyTimeout bounds how long Ensure waits for the topics to be usable: a topic that a
// broker has accepted is not yet in every broker's metadata, nor are its partitions led.
const ReadyTimeout = 30 * time.Second

// readyPoll is how often Ensure asks the metadata again while it waits.
const readyPoll = 100 * time.Millisecond

// Ensure creates the hits and counts topics of cfg that do not exist yet, with the
// partitions and configs of cfg, and verifies those that exist: partition count and
// cleanup.policy must match (counts must be compacted, hits must not be). Every mismatch is
// reported as a *MismatchError (joined with errors.Join when there are several). Existing
// topics are never altered. Safe to call concurrently from several processes: a topic that
// another caller created in between is verified instead.
//
// Ensure returns only once every topic it created or verified is described by the cluster
// with all its partitions led (for up to ReadyTimeout, or ctx), so that a script can use the
// topics right after it; a topic still not ready then is reported as not ready.
func Ensure(ctx context.Context, adm *kadm.Client, cfg topics.Config) (EnsureResult, error) {
	var res EnsureResult
	cfg, err := cfg.Normalize()
	if err != nil {
		return res, err
	}
	specs := []struct {
		name       string
		partitions int32
		configs    map[string]*string
		policy     string
	}{
		{cfg.HitsTopic, cfg.HitsPartitions, cfg.HitsConfigs(), "delete"},
		{cfg.CountsTopic, cfg.CountsPartitions, cfg.CountsConfigs(), "compact"},
	}
	var errs []error
	created := make([]bool, len(specs))
	want := make(map[string]int32, len(specs))
	for i, s := range specs {
		c, err := createIfMissing(ctx, adm, s.name, s.partitions, cfg.ReplicationFactor, s.configs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		created[i] = c
		// An existing topic's partition count is checked by verify, with its own error;
		// waiting for it to match would only turn that error into a timeout.
		want[s.name] = 0
		if c {
			want[s.name] = s.partitions
		}
	}
	if len(want) > 0 {
		if err := waitReady(ctx, adm, want, ReadyTimeout); err != nil {
			return res, errors.Join(append(errs, err)...)
		}
	}
	for i, s := range specs {
		if _, ok := want[s.name]; !ok {
			continue
		}
		if created[i] {
			res.Created = append(res.Created, s.name)
			continue
		}
		if err := verify(ctx, adm, s.name, s.partitions, s.policy); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Verified = append(res.Verified, s.name)
	}
	return res, errors.Join(errs...)
}

// waitReady polls the cluster's metadata until every topic of want is listed without error,
// with want[topic] partitions (any number when 0), each with a leader, or fails after
// timeout (or when ctx ends) naming what is still missing.
func waitReady(ctx context.Context, adm *kadm.Client, want map[string]int32, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		details, err := adm.ListTopics(ctx, names...)
		var missing []error
		if err != nil {
			missing = append(missing, err)
		} else {
			for _, n := range names {
				if why := notReady(details[n], want[n]); why != "" {
					missing = append(missing, fmt.Errorf("topic %q: %s", n, why))
				}
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics: not ready after %v: %w", timeout, errors.Join(missing...))
		case <-tick.C:
		}
	}
}

// notReady says why a topic's metadata does not show it usable yet, or "" when it does.
func notReady(td kadm.TopicDetail, partitions int32) string {
	switch {
	case td.Topic == "":
		return "not in the metadata yet"
	case td.Err != nil:
		return td.Err.Error()
	case len(td.Partitions) == 0:
		return "no partitions in the metadata yet"
	case partitions > 0 && int32(len(td.Partitions)) != partitions:
		return fmt.Sprintf("%d of %d partitions in the metadata", len(td.Partitions), partitions)
	}
	for _, p := range td.Partitions {
		if p.Err != nil {
			return fmt.Sprintf("partition %d: %v", p.Partition, p.Err)
		}
		if p.Leader < 0 {
			return fmt.Sprintf("partition %d has no leader yet", p.Partition)
		}
	}
	return ""
}

func createIfMissing(ctx context.Context, adm *kadm.Client, name string, partitions int32, rf int16, configs map[string]*string) (bool, error) {
	resp, err := adm.CreateTopic(ctx, partitions, rf, configs, name)
	if err == nil {
		err = resp.Err
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return false, nil
	default:
		return false, fmt.Errorf("topics: create %q: %w", name, err)
	}
}

func verify(ctx context.Context, adm *kadm.Client, name string, partitions int32, policy string) error {
	details, err := adm.ListTopics(ctx, name)
	if err != nil {
		return fmt.Errorf("topics: describe %q: %w", name, err)
	}
	td, ok := details[name]
	if !ok || td.Err != nil {
		return fmt.Errorf("topics: describe %q: %w", name, errors.Join(td.Err, errNotListed(ok)))
	}
	var errs []error
	if got := int32(len(td.Partitions)); got != partitions {
		errs = append(errs, &MismatchError{Topic: name, Setting: "partitions", Have: fmt.Sprint(got), Want: fmt.Sprint(partitions)})
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, name)
	if err != nil {
		return fmt.Errorf("topics: describe configs of %q: %w", name, err)
	}
	rc, err := rcs.On(name, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return fmt.Errorf("topics: describe configs of %q: %w", name, err)
	}
	have := "delete"
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			have = *c.Value
		}
	}
	if have != policy {
		errs = append(errs, &MismatchError{Topic: name, Setting: "cleanup.policy", Have: fmt.Sprintf("%q", have), Want: fmt.Sprintf("%q", policy)})
	}
	return errors.Join(errs...)
}

func errNotListed(listed bool) error {
	if listed {
		return nil
	}
	return errors.New("not in the metadata response")
}
