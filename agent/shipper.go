package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// shipper sends batches over one Ingest.Ship stream at a time, keeps at most
// MaxInFlight unacknowledged, and resends every unacknowledged batch, in
// order, on a new stream after a failure. Acks arrive in seq order; the
// acked cursor is the resourceVersion of the last acknowledged batch.
type shipper struct {
	cfg    Config
	client eventpipev1.IngestClient
	log    *slog.Logger
	m      *metrics

	slots  chan struct{} // a token per batch in flight
	notify chan struct{}

	mu       sync.Mutex
	seq      uint64
	inflight []*flight // unacknowledged, in seq order

	ackedRV   atomic.Pointer[string]
	lastAckAt atomic.Int64 // unix nanos
	acked     atomic.Uint64
}

type flight struct {
	b       *eventpipev1.Batch
	created time.Time
	sentAt  time.Time
}

func newShipper(cfg Config, client eventpipev1.IngestClient, log *slog.Logger, m *metrics) *shipper {
	s := &shipper{
		cfg: cfg, client: client, log: log, m: m,
		slots:  make(chan struct{}, cfg.Ship.MaxInFlight),
		notify: make(chan struct{}, 1),
	}
	s.lastAckAt.Store(time.Now().UnixNano())
	return s
}

// submit queues b for sending; it blocks while MaxInFlight batches are
// unacknowledged. It fails only when ctx ends.
func (s *shipper) submit(ctx context.Context, b *eventpipev1.Batch, created time.Time) error {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	s.seq++
	b.Seq = s.seq
	s.inflight = append(s.inflight, &flight{b: b, created: created})
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	return nil
}

// oldestUnacked is the creation time of the oldest unacknowledged batch
// (zero when none).
func (s *shipper) oldestUnacked() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.inflight) == 0 {
		return time.Time{}
	}
	return s.inflight[0].created
}

// run keeps a Ship stream open until ctx ends, reconnecting with backoff.
func (s *shipper) run(ctx context.Context) error {
	backoff := s.cfg.Ship.BackoffInitial
	for ctx.Err() == nil {
		start := time.Now()
		err := s.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		s.m.shipErrors.Inc()
		if time.Since(start) > 10*s.cfg.Ship.BackoffMax {
			backoff = s.cfg.Ship.BackoffInitial
		}
		s.log.Warn("ship stream to collector failed; reconnecting", "err", err, "backoff", backoff)
		if !sleepCtx(ctx, jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, s.cfg.Ship.BackoffMax)
	}
	return nil
}

// stream runs one Ship stream: it (re)sends every unacknowledged batch, then
// new ones as they come, while reading Acks.
func (s *shipper) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.client.Ship(sctx)
	if err != nil {
		return fmt.Errorf("open ship stream: %w", err)
	}
	recvErr := make(chan error, 1)
	go func() { recvErr <- s.recv(st) }()

	var lastSent uint64
	s.mu.Lock()
	if len(s.inflight) > 0 {
		lastSent = s.inflight[0].b.Seq - 1
		s.m.batches.WithLabelValues("resent").Add(float64(len(s.inflight)))
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		var next []*flight
		now := time.Now()
		for _, f := range s.inflight {
			if f.b.Seq > lastSent {
				f.sentAt = now
				next = append(next, f)
			}
		}
		s.mu.Unlock()
		for _, f := range next {
			if err := st.Send(f.b); err != nil {
				cancel()
				<-recvErr
				return fmt.Errorf("send batch %d: %w", f.b.Seq, err)
			}
			lastSent = f.b.Seq
		}
		select {
		case <-s.notify:
		case err := <-recvErr:
			return err
		case <-ctx.Done():
			cancel()
			<-recvErr
			return nil
		}
	}
}

func (s *shipper) recv(st grpc.BidiStreamingClient[eventpipev1.Batch, eventpipev1.Ack]) error {
	for {
		ack, err := st.Recv()
		if err != nil {
			return fmt.Errorf("receive ack: %w", err)
		}
		now := time.Now()
		s.mu.Lock()
		n := 0
		for n < len(s.inflight) && s.inflight[n].b.Seq <= ack.GetSeq() {
			f := s.inflight[n]
			if !f.sentAt.IsZero() {
				s.m.shipLatency.Observe(now.Sub(f.sentAt).Seconds())
			}
			if rv := f.b.GetResourceVersion(); rv != "" {
				s.ackedRV.Store(&rv)
			}
			s.inflight[n] = nil
			n++
		}
		s.inflight = s.inflight[n:]
		s.mu.Unlock()
		if n == 0 {
			continue // an Ack for a batch already acknowledged
		}
		s.m.batches.WithLabelValues("acked").Add(float64(n))
		s.m.acked.WithLabelValues("stored").Add(float64(ack.GetStored()))
		s.m.acked.WithLabelValues("duplicate").Add(float64(ack.GetDuplicates()))
		s.acked.Add(uint64(ack.GetStored()) + uint64(ack.GetDuplicates()))
		s.lastAckAt.Store(now.UnixNano())
		for range n {
			<-s.slots
		}
	}
}

// ---- connection ----

// dialCollector opens a gRPC client connection with the configured
// transport security and bearer token.
func dialCollector(cfg CollectorConfig) (*grpc.ClientConn, error) {
	var opts []grpc.DialOption
	if cfg.Insecure {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.ServerName}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("read collector CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("collector CA %s: no PEM certificate", cfg.CAFile)
			}
			tc.RootCAs = pool
		}
		if cfg.CertFile != "" {
			certFile, keyFile := cfg.CertFile, cfg.KeyFile
			// Re-read on every handshake so rotated certificates are used.
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				c, err := tls.LoadX509KeyPair(certFile, keyFile)
				if err != nil {
					return nil, fmt.Errorf("load collector client certificate: %w", err)
				}
				return &c, nil
			}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	if cfg.TokenFile != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenFileCreds{path: cfg.TokenFile, secure: !cfg.Insecure}))
	}
	opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(64<<20)))
	conn, err := grpc.NewClient(cfg.Address, opts...)
	if err != nil {
		return nil, fmt.Errorf("collector client %s: %w", cfg.Address, err)
	}
	return conn, nil
}

// tokenFileCreds sends "authorization: Bearer <token>", re-reading the file
// for every call so a rotated token is used.
type tokenFileCreds struct {
	path   string
	secure bool
}

func (t tokenFileCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(t.path)
	if err != nil {
		return nil, fmt.Errorf("read collector token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, errors.New("collector token file is empty")
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (t tokenFileCreds) RequireTransportSecurity() bool { return t.secure }
