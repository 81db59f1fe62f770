package kafka

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks"
)

// TestMissingTopicIsNamed: with create_topic off and no topic on the broker,
// a push fails retryably (the topic may still be created: nothing is
// dropped) with an error that names the topic and the two ways out, and the
// sink's topic-missing gauge says so until the topic exists.
func TestMissingTopicIsNamed(t *testing.T) {
	t.Parallel()
	b := startBroker(t) // no topics, and kfake does not create them on produce
	cfg := testConfig(b.addr(), "audit.missing")
	cfg.CreateTopic.Enabled = false
	reg := prometheus.NewRegistry()
	s, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = pushSome(t, s, "miss-", 3)
	if err == nil {
		t.Fatal("push to a missing topic succeeded")
	}
	if sinks.IsPermanent(err) {
		t.Errorf("missing topic classified permanent (records would be dropped): %v", err)
	}
	for _, want := range []string{`"audit.missing" does not exist`, "create_topic.enabled"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if v := gaugeValue(t, reg, "eventpipe_sink_kafka_topic_missing"); v != 1 {
		t.Errorf("eventpipe_sink_kafka_topic_missing = %v, want 1", v)
	}

	// Someone creates the topic (here: a second sink allowed to): the same
	// records go through and the gauge clears.
	ccfg := cfg
	ccfg.CreateTopic.Enabled = true
	creator, err := New(ccfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer creator.Close()
	if err := pushSome(t, creator, "create-", 1); err != nil {
		t.Fatalf("creating the topic: %v", err)
	}
	// The writer learns of the topic at its next metadata refresh
	// (the client caches metadata for a second at least).
	deadline := time.Now().Add(30 * time.Second)
	for err = pushSome(t, s, "miss-", 3); err != nil; err = pushSome(t, s, "miss-", 3) {
		if time.Now().After(deadline) {
			t.Fatalf("push 30 s after the topic was created: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if v := gaugeValue(t, reg, "eventpipe_sink_kafka_topic_missing"); v != 0 {
		t.Errorf("eventpipe_sink_kafka_topic_missing = %v after the topic appeared, want 0", v)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
