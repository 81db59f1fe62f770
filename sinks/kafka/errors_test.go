package kafka

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eventpipe/eventpipe/sinks"
)

// failProduce makes the broker answer every produce request with code for
// every partition, while on is set.
func failProduce(b *broker, code int16, on *atomic.Bool) {
	b.mu.Lock()
	c := b.c
	b.mu.Unlock()
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID // v13+ names topics by id
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// TestBrokerErrorClasses: the broker's per-partition error codes map to the
// runner's classes.
func TestBrokerErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  int16
		check func(t *testing.T, err error)
	}{
		{"throttling quota", kerr.ThrottlingQuotaExceeded.Code, func(t *testing.T, err error) {
			var te *sinks.ThrottleError
			if !errors.As(err, &te) {
				t.Errorf("got %v, want a ThrottleError", err)
			}
		}},
		{"not enough replicas", kerr.NotEnoughReplicas.Code, func(t *testing.T, err error) {
			var te *sinks.ThrottleError
			var pe *sinks.PartialError
			if err == nil || sinks.IsPermanent(err) || errors.As(err, &te) || errors.As(err, &pe) {
				t.Errorf("got %v, want a plain retryable error", err)
			}
		}},
		{"invalid record", kerr.InvalidRecord.Code, func(t *testing.T, err error) {
			var pe *sinks.PartialError
			if !errors.As(err, &pe) || len(pe.Failed) != 5 {
				t.Errorf("got %v, want every record refused through a PartialError", err)
			}
		}},
		{"topic authorization", kerr.TopicAuthorizationFailed.Code, func(t *testing.T, err error) {
			var pe *sinks.PartialError
			if err == nil || sinks.IsPermanent(err) || errors.As(err, &pe) {
				t.Errorf("got %v, want retryable (an operator can fix ACLs)", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBroker(t, kfake.SeedTopics(3, "classes"))
			cfg := testConfig(b.addr(), "classes")
			cfg.CreateTopic.Enabled = false
			s, err := New(cfg, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var on atomic.Bool
			on.Store(true)
			failProduce(b, tc.code, &on)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			tc.check(t, pushSome(t, s, "cls-", 5))
			on.Store(false)
			if err := s.Push(ctx, nil); err != nil {
				t.Errorf("empty push: %v", err)
			}
			if err := pushSome(t, s, "cls-ok-", 5); err != nil {
				t.Errorf("push after the broker recovered: %v", err)
			}
		})
	}
}
