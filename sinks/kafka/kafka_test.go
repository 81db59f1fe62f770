package kafka

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"testing"
	"time"

	"go.uber.org/goleak"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testConfig(addr, topic string) Config {
	c := NewDefaultConfig()
	c.Conn.Brokers = []string{addr}
	c.Topic = topic
	c.WriteTimeout = 3 * time.Second
	c.CreateTopic = CreateTopicConfig{Enabled: true, Partitions: 3, ReplicationFactor: 1}
	return c
}

func TestContract(t *testing.T) {
	sinktest.RunContract(t, sinktest.Harness{
		Name:    "kafka",
		Records: 200,
		Timeout: 3 * time.Minute,
		NewTarget: func(t *testing.T) *sinktest.Target {
			// The broker refuses records over 256 KiB; the sink is told it may
			// send up to 1 MB, so a poisoned record reaches the broker and is
			// refused there (MESSAGE_TOO_LARGE), for real.
			b := startBroker(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "262144"}))
			cfg := testConfig(b.addr(), "contract")
			return &sinktest.Target{
				NewPusher: func() (sinks.Pusher, error) { return New(cfg, nil, prometheus.NewRegistry()) },
				Delivered: func(ctx context.Context) ([]string, error) {
					msgs, err := readTopic(ctx, nil, b.addr(), cfg.Topic)
					if err != nil {
						return nil, err
					}
					ids := make([]string, len(msgs))
					for i, m := range msgs {
						ids[i] = header(m, "ce_id")
					}
					return ids, nil
				},
				Outage: func(t *testing.T) func() {
					b.stop()
					return b.start
				},
				Poison: func(o *eventpipev1.Occurrence) {
					raw := make([]byte, 450<<10)
					_, _ = rand.Read(raw)
					o.Message = base64.StdEncoding.EncodeToString(raw) // incompressible, ~600 KB
				},
			}
		},
	})
}
