// Package topicadmin creates and verifies streamlimit's Kafka topics with the admin API.
// It is kept apart from package topics, the record contract, so that code which only
// encodes or decodes records does not pull in a Kafka client.
package topicadmin

import (
	"context"
	"errors"
	"fmt"

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

// Ensure creates the hits and counts topics of cfg that do not exist yet, with the
// partitions and configs of cfg, and verifies those that exist: partition count and
// cleanup.policy must match (counts must be compacted, hits must not be). Every mismatch is
// reported as a *MismatchError (joined with errors.Join when there are several). Existing
// topics are never altered. Safe to call concurrently from several processes: a topic that
// another caller created in between is verified instead.
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
	for _, s := range specs {
		created, err := createIfMissing(ctx, adm, s.name, s.partitions, cfg.ReplicationFactor, s.configs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if created {
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
