package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// headerLastCursor is the collector's Follow response header holding the
// log's last cursor at subscription time (see the Follow contract in
// api/eventpipe/v1/follow.proto and docs/design.md).
const headerLastCursor = "eventpipe-last-cursor"

// follower reads this gateway's occurrences from the collector's Follow
// stream into the hub, resuming after the last cursor it read.
type follower struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	hub *hub

	cursor uint64 // last cursor read (0: none yet)
}

func newFollower(cfg Config, log *slog.Logger, m *metrics, h *hub) *follower {
	return &follower{cfg: cfg, log: log, m: m, hub: h}
}

// run follows until ctx ends; every failure is logged, counted and retried
// with backoff. It never touches driver traffic.
func (f *follower) run(ctx context.Context) {
	backoff := f.cfg.Follow.BackoffMin
	var conn *grpc.ClientConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for ctx.Err() == nil {
		var err error
		if conn == nil {
			if conn, err = f.dial(); err != nil {
				// A config problem (unreadable CA or token file): retried,
				// as the file may appear (a Secret mounted late).
				f.m.followErrors.WithLabelValues("config").Inc()
				f.log.Error("cannot reach the collector: fix the collector settings; driver traffic is unaffected", "err", err)
			}
		}
		got := false
		if conn != nil {
			got, err = f.once(ctx, eventpipev1.NewFollowClient(conn))
		}
		if ctx.Err() != nil {
			return
		}
		if got {
			backoff = f.cfg.Follow.BackoffMin
		}
		f.m.connected.Set(0)
		f.hub.setFollowing(false)
		st := status.Convert(err)
		switch st.Code() {
		case codes.OutOfRange:
			// The collector's log was reset (or is another collector):
			// start over from its tail; event ids keep it from repeating.
			f.log.Warn("collector cannot resume after our cursor; re-reading its tail", "cursor", f.cursor, "err", st.Message())
			f.cursor = 0
		case codes.DataLoss:
			f.m.followErrors.WithLabelValues("data_loss").Inc()
			f.log.Warn("collector retention removed events before the proxy read them", "err", st.Message())
			continue
		}
		f.m.followErrors.WithLabelValues(strings.ToLower(st.Code().String())).Inc()
		f.log.Warn("collector follow stream lost; driver traffic is unaffected; retrying", "code", st.Code(),
			"err", st.Message(), "resume_after", f.cursor, "in", backoff)
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, f.cfg.Follow.BackoffMax)
	}
}

// once runs one Follow subscription; got reports whether the collector
// accepted it.
func (f *follower) once(ctx context.Context, c eventpipev1.FollowClient) (got bool, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &eventpipev1.FollowRequest{GatewayId: f.cfg.GatewayID}
	if f.cursor > 0 {
		req.AfterCursor = f.cursor
	} else {
		req.Tail = uint32(f.cfg.Follow.StartTail)
	}
	stream, err := c.Follow(ctx, req)
	if err != nil {
		return false, err
	}
	hdr, err := stream.Header()
	if err == nil && len(hdr.Get(headerLastCursor)) > 0 {
		got = true
		f.m.connected.Set(1)
		f.hub.setFollowing(true)
		f.log.Info("following the collector", "gateway_id", f.cfg.GatewayID, "after_cursor", req.AfterCursor, "tail", req.Tail)
	}
	restored := f.hub.restoredCursor()
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, status.Error(codes.Unavailable, "follow stream ended")
		}
		if err != nil {
			return got, err
		}
		f.cursor = m.GetCursor()
		f.m.occurrences.Inc()
		f.hub.apply(m.GetCursor(), m.GetOccurrence(), req.AfterCursor == 0 && m.GetCursor() <= restored)
	}
}

// dial builds the collector connection (TLS unless insecure, optional
// mTLS, the bearer token re-read from its file on every call).
func (f *follower) dial() (*grpc.ClientConn, error) {
	c := f.cfg.Collector
	var opts []grpc.DialOption
	if c.Insecure {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("collector.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("collector.ca_file %s: no PEM certificate", c.CAFile)
			}
			tc.RootCAs = pool
		}
		if c.CertFile != "" {
			kp, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("collector.cert_file/key_file: %w", err)
			}
			tc.Certificates = []tls.Certificate{kp}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	if c.TokenFile != "" {
		if _, err := readToken(c.TokenFile); err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tokenCreds{path: c.TokenFile, secure: !c.Insecure}))
	}
	opts = append(opts,
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	conn, err := grpc.NewClient(c.Address, opts...)
	if err != nil {
		return nil, fmt.Errorf("collector.address %s: %w", c.Address, err)
	}
	return conn, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("collector.token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("collector.token_file %s is empty", path)
	}
	return tok, nil
}

// tokenCreds sends "authorization: Bearer <token>", re-reading the file so
// a rotated token is used on the next call.
type tokenCreds struct {
	path   string
	secure bool
}

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := readToken(t.path)
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (t tokenCreds) RequireTransportSecurity() bool { return t.secure }

func mdUint(md metadata.MD, key string) uint64 {
	v := md.Get(key)
	if len(v) == 0 {
		return 0
	}
	n, _ := strconv.ParseUint(v[0], 10, 64)
	return n
}

func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}

// readState reads the delivered cursor a previous run saved (0 if none).
func readState(path string) (uint64, error) {
	if path == "" {
		return 0, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: not a cursor: %w", path, err)
	}
	return n, nil
}

// writeState saves the delivered cursor atomically (temp file + rename).
func writeState(path string, cursor uint64) error {
	if path == "" || cursor == 0 {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".driver-proxy-state-*")
	if err != nil {
		return err
	}
	_, werr := tmp.WriteString(strconv.FormatUint(cursor, 10) + "\n")
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		return errors.Join(werr, cerr)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}
