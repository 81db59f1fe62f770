package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/collector/backbone"
)

const agentToken = "bench-kafka-agent-token-0123456789"

// collectorReplica is a real collector in Kafka mode (collector.New with
// log: kafka, token auth, gRPC on loopback, its own metrics registry as its
// own process would have); agents reach it over the Ingest API.
type collectorReplica struct {
	addr string
}

func startCollector(bcfg backbone.Config, o options, i int) (replica, func(), error) {
	dir, err := os.MkdirTemp("", "kafka-bench-")
	if err != nil {
		return nil, nil, err
	}
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("- {token: %s, name: bench-agent, role: agent, clusters: [\"*\"]}\n", agentToken)), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	cfg := collector.NewDefaultConfig()
	cfg.Log = collector.LogKafka
	b := bcfg
	b.Conn.ClientID = fmt.Sprintf("bench-collector-%d", i)
	if b.Transactions.Enabled {
		b.Transactions.ID = fmt.Sprintf("bench-collector-%d", i) // one slot per replica
	}
	cfg.Backbone = &b
	cfg.GRPC.Listen, cfg.HTTP.Listen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.GRPC.IngestPipeline = o.window
	cfg.Auth.TokensFile = tokens
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	c, err := collector.New(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "collector:", err)
		}
		os.RemoveAll(dir)
	}
	return collectorReplica{addr: c.GRPCAddr()}, stop, nil
}

type grpcStream struct {
	conn *grpc.ClientConn
	st   grpc.BidiStreamingClient[eventpipev1.Batch, eventpipev1.Ack]
}

func (r collectorReplica) ship(ctx context.Context) (stream, error) {
	conn, err := grpc.NewClient(r.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(agentToken)))
	if err != nil {
		return nil, err
	}
	st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &grpcStream{conn: conn, st: st}, nil
}

func (s *grpcStream) send(b *eventpipev1.Batch) error { return s.st.Send(b) }

func (s *grpcStream) recv() (uint64, int, error) {
	a, err := s.st.Recv()
	if err != nil {
		return 0, 0, err
	}
	if len(a.GetRejected()) > 0 {
		return a.GetSeq(), int(a.GetStored()), fmt.Errorf("batch %d: %d occurrences rejected: %v", a.GetSeq(), len(a.GetRejected()), a.GetRejected()[0])
	}
	return a.GetSeq(), int(a.GetStored()), nil
}

func (s *grpcStream) close() {
	_ = s.st.CloseSend()
	s.conn.Close()
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }
