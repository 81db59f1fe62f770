package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
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

// readTopic returns every record of topic, partition by partition in
// offset order.
func readTopic(ctx context.Context, d *kafka.Dialer, addr, topic string) ([]kafka.Message, error) {
	if d == nil {
		d = &kafka.Dialer{Timeout: 5 * time.Second}
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		return nil, err
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].ID < parts[j].ID })
	var out []kafka.Message
	for _, p := range parts {
		lc, err := d.DialLeader(ctx, "tcp", addr, topic, p.ID)
		if err != nil {
			return nil, err
		}
		msgs, err := readPartition(lc)
		lc.Close()
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p.ID, err)
		}
		out = append(out, msgs...)
	}
	return out, nil
}

func readPartition(lc *kafka.Conn) ([]kafka.Message, error) {
	first, last, err := lc.ReadOffsets()
	if err != nil {
		return nil, err
	}
	var out []kafka.Message
	off := first
	for off < last {
		if _, err := lc.Seek(off, kafka.SeekAbsolute); err != nil {
			return nil, err
		}
		_ = lc.SetReadDeadline(time.Now().Add(5 * time.Second))
		batch := lc.ReadBatch(1, 16<<20)
		n := 0
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			out = append(out, m)
			off = m.Offset + 1
			n++
		}
		if err := batch.Close(); err != nil && !errors.Is(err, context.DeadlineExceeded) && n == 0 {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("no progress reading at offset %d of %d", off, last)
		}
	}
	return out, nil
}

func header(m kafka.Message, k string) string {
	for _, h := range m.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

var _ = tls.VersionTLS12
