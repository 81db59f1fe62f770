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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/collectorclient"
)

// shipper sends batches over one Ingest.Ship stream at a time, keeps at most
// MaxInFlight unacknowledged, and resends every unacknowledged batch, in
// order, on a new stream after a failure. Acks arrive in seq order; the
// acked cursor is the resourceVersion of the last acknowledged batch.
//
// Refusals for good never stall it. An occurrence the collector refuses
// (Ack.rejected) and one the agent cannot encode are dead-lettered and the
// rest of the batch goes on. A stream ended with InvalidArgument or
// FailedPrecondition (or a message over the collector's size limit) refuses
// one batch for good: the batch a BatchRejection detail names is
// dead-lettered and dropped; without that detail (an older collector) the
// shipper isolates the culprit by sending one batch per stream until a
// batch is acknowledged, and drops the lone batch a permanent status then
// refuses. Every other status (Unavailable, ResourceExhausted,
// Unauthenticated, PermissionDenied, ...) is transient: the batch is
// re-sent with backoff, and /readyz fails after ship.ack_timeout.
type shipper struct {
	cfg    Config
	client eventpipev1.IngestClient
	log    *slog.Logger
	m      *metrics
	dl     *deadLetters

	slots  chan struct{} // a token per batch in flight
	notify chan struct{}

	mu       sync.Mutex
	seq      uint64
	inflight []*flight // unacknowledged, in seq order
	// isolating: send only the oldest unacknowledged batch per stream
	// (isolated is its seq once sent), to find a batch refused for good.
	isolating bool
	isolated  uint64

	ackedRV   atomic.Pointer[string]
	lastAckAt atomic.Int64 // unix nanos
	acked     atomic.Uint64
}

type flight struct {
	b       *eventpipev1.Batch
	created time.Time
	sentAt  time.Time
}

func newShipper(cfg Config, client eventpipev1.IngestClient, log *slog.Logger, m *metrics, dl *deadLetters) *shipper {
	s := &shipper{
		cfg: cfg, client: client, log: log, m: m, dl: dl,
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

// idle reports whether no batch is waiting for its acknowledgement: a
// batch sent now goes out at once and nothing it could join is on the way.
func (s *shipper) idle() bool { return len(s.slots) == 0 }

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
		if s.refused(err) {
			// The refused batch is out of the way: go on at once.
			backoff = s.cfg.Ship.BackoffInitial
			continue
		}
		s.log.Warn("ship stream to collector failed; reconnecting", "err", err, "code", status.Code(err).String(), "backoff", backoff)
		if !sleepCtx(ctx, jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, s.cfg.Ship.BackoffMax)
	}
	return nil
}

// permanent reports whether a status ending a stream refuses a batch for
// good (re-sending the same batch cannot succeed).
func permanent(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition:
		return true
	case codes.ResourceExhausted:
		// gRPC's own refusal of a message over the receiver's limit; any
		// other ResourceExhausted is a throttle.
		return strings.Contains(st.Message(), "larger than max")
	}
	return false
}

// refused handles the error that ended a stream when it refuses a batch for
// good: it drops that batch to the dead letter (true), or, when the status
// does not say which batch, starts isolating (false: reconnect as usual).
func (s *shipper) refused(err error) bool {
	if !permanent(err) {
		return false
	}
	var rej *eventpipev1.BatchRejection
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*eventpipev1.BatchRejection); ok {
			rej = r
		}
	}
	s.mu.Lock()
	seq := uint64(0)
	switch {
	case rej != nil:
		seq = rej.GetSeq()
	case s.isolating && s.isolated != 0:
		seq = s.isolated
	default:
		s.isolating, s.isolated = true, 0
		s.mu.Unlock()
		s.log.Warn("collector refused a batch for good without naming it; sending one batch per stream to find it", "err", err)
		return false
	}
	var f *flight
	for i, g := range s.inflight {
		if g.b.GetSeq() == seq {
			f = g
			s.inflight = append(s.inflight[:i:i], s.inflight[i+1:]...)
			break
		}
	}
	s.isolating, s.isolated = false, 0
	s.mu.Unlock()
	if f == nil {
		s.log.Warn("collector refused a batch that is not in flight; reconnecting", "seq", seq, "err", err)
		return false
	}
	<-s.slots
	s.m.batches.WithLabelValues("refused").Inc()
	msg := err.Error()
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		msg = se.GRPCStatus().Message()
	}
	byIndex := map[uint32]*eventpipev1.Rejection{}
	for _, r := range rej.GetOccurrences() {
		byIndex[r.GetIndex()] = r
	}
	for i, o := range f.b.GetOccurrences() {
		reason, detail := dlBatchRefused, msg
		if r, ok := byIndex[uint32(i)]; ok && r.GetReason() != "" {
			reason, detail = r.GetReason(), r.GetMessage()
		}
		s.dl.add(seq, o, "", reason, detail)
	}
	s.log.Error("collector refused a batch for good; its occurrences are dead-lettered and the agent moves on",
		"seq", seq, "occurrences", len(f.b.GetOccurrences()), "resource_version", f.b.GetResourceVersion(), "err", err)
	return true
}

// dropUnencodable removes from f's batch the occurrences that cannot be
// encoded (invalid UTF-8 in a string field), dead-lettering them; it
// reports whether any was found. Called only after a Send failed.
func (s *shipper) dropUnencodable(f *flight) bool {
	if _, err := proto.Marshal(f.b); err == nil {
		return false
	}
	s.mu.Lock()
	var kept, bad []*eventpipev1.Occurrence
	var errs []error
	for _, o := range f.b.GetOccurrences() {
		if _, err := proto.Marshal(o); err != nil {
			bad, errs = append(bad, o), append(errs, err)
			continue
		}
		kept = append(kept, o)
	}
	f.b.Occurrences = kept
	s.mu.Unlock()
	for i, o := range bad {
		s.dl.add(f.b.GetSeq(), o, "", dlUnencodable, errs[i].Error())
	}
	return len(bad) > 0
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
	s.isolated = 0 // nothing sent on this stream yet
	if len(s.inflight) > 0 {
		lastSent = s.inflight[0].b.Seq - 1
		s.m.batches.WithLabelValues("resent").Add(float64(len(s.inflight)))
		n := 0
		for _, f := range s.inflight {
			n += len(f.b.GetOccurrences())
		}
		s.m.resent.Add(float64(n))
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		var next []*flight
		now := time.Now()
		for _, f := range s.inflight {
			if f.b.Seq > lastSent {
				if s.isolating && (s.isolated != 0 || len(next) == 1) {
					break
				}
				f.sentAt = now
				next = append(next, f)
			}
		}
		if s.isolating && len(next) == 1 {
			s.isolated = next[0].b.Seq
		}
		s.mu.Unlock()
		for _, f := range next {
			if err := st.Send(f.b); err != nil {
				cancel()
				<-recvErr
				if s.dropUnencodable(f) {
					return fmt.Errorf("send batch %d: dropped occurrences that cannot be encoded: %w", f.b.Seq, err)
				}
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
		var refused *flight
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
			if f.b.Seq == ack.GetSeq() && len(ack.GetRejected()) > 0 {
				refused = f
			}
			s.inflight[n] = nil
			n++
		}
		s.inflight = s.inflight[n:]
		if n > 0 && s.isolating {
			// A batch went through: the culprit, if any, was not it.
			s.isolating, s.isolated = false, 0
			select {
			case s.notify <- struct{}{}:
			default:
			}
		}
		s.mu.Unlock()
		if n == 0 {
			continue // an Ack for a batch already acknowledged
		}
		s.m.batches.WithLabelValues("acked").Add(float64(n))
		s.m.acked.WithLabelValues("stored").Add(float64(ack.GetStored()))
		s.m.acked.WithLabelValues("duplicate").Add(float64(ack.GetDuplicates()))
		s.m.acked.WithLabelValues("rejected").Add(float64(len(ack.GetRejected())))
		s.acked.Add(uint64(ack.GetStored()) + uint64(ack.GetDuplicates()))
		s.lastAckAt.Store(now.UnixNano())
		if refused != nil {
			occs := refused.b.GetOccurrences()
			for _, r := range ack.GetRejected() {
				var o *eventpipev1.Occurrence
				if i := int(r.GetIndex()); i < len(occs) {
					o = occs[i]
				}
				s.dl.add(ack.GetSeq(), o, r.GetEventId(), r.GetReason(), r.GetMessage())
			}
		}
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
	opts = append(opts,
		grpc.WithUserAgent(buildinfo.UserAgent("agent")),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(64<<20)),
		// A collector whose node vanished sends no reset: pings find out,
		// so the shipper moves to another replica instead of waiting on a
		// dead connection. The collector permits pings every 10s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
	)
	target := cfg.Address
	if len(cfg.Addresses) > 0 {
		var r *manual.Resolver
		target, r = collectorclient.ReplicasResolver(cfg.Addresses)
		opts = append(opts, grpc.WithResolvers(r),
			// One connection at a time, to the first replica of a shuffled
			// list that answers; when it breaks, the next Ship stream
			// goes to whichever answers then.
			grpc.WithDefaultServiceConfig(collectorclient.PickFirst(true)))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("collector client %s: %w", describeTarget(cfg), err)
	}
	return conn, nil
}

// describeTarget names the collector(s) in messages.
func describeTarget(cfg CollectorConfig) string {
	if len(cfg.Addresses) > 0 {
		return strings.Join(cfg.Addresses, ",")
	}
	return cfg.Address
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
