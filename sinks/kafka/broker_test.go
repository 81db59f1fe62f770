package kafka

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eventpipe/eventpipe/sinks/kafka/kafkatest"
)

// broker is a real Kafka-protocol broker (kfake) on a loopback port,
// persisting to a directory so it can be stopped and started again with
// its data, like a real broker restart.
type broker struct {
	t    testing.TB
	port int // 0 until the first start binds one
	dir  string
	opts []kfake.Opt
	mu   sync.Mutex
	c    *kfake.Cluster
}

func startBroker(t testing.TB, opts ...kfake.Opt) *broker {
	b := &broker{t: t, dir: t.TempDir(), opts: opts}
	b.start()
	t.Cleanup(b.stop)
	return b
}

// startMemBroker is a broker without persistence (for benchmarks: no fsync
// per produce); it cannot be restarted with its data.
func startMemBroker(t testing.TB, opts ...kfake.Opt) *broker {
	b := &broker{t: t, opts: opts}
	b.start()
	t.Cleanup(b.stop)
	return b
}

// start binds a port of its choosing the first time (a port picked free
// and closed again could be taken by another process before kfake binds
// it) and the same port on a restart, since clients keep the address.
func (b *broker) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		return
	}
	opts := []kfake.Opt{kfake.Ports(b.port), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3)}
	if b.dir != "" {
		opts = append(opts, kfake.DataDir(b.dir), kfake.SyncWrites())
	}
	opts = append(opts, b.opts...)
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly after a stop
		if b.c, err = kfake.NewCluster(opts...); err == nil {
			if b.port == 0 {
				_, port, _ := net.SplitHostPort(b.c.ListenAddrs()[0])
				b.port, _ = strconv.Atoi(port)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.t.Fatalf("start kfake on port %d: %v", b.port, err)
}

func (b *broker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		b.c.Close()
		b.c = nil
	}
}

func (b *broker) addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// readTopic returns every record of topic (kafkatest.ReadTopic).
func readTopic(ctx context.Context, extra []kgo.Opt, addr, topic string) ([]*kgo.Record, error) {
	return kafkatest.ReadTopic(ctx, append([]kgo.Opt{kgo.SeedBrokers(addr)}, extra...), topic)
}

func header(m *kgo.Record, k string) string {
	for _, h := range m.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}
