package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/collectorclient"
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
	// position is the last resume position read from a collector in Kafka
	// mode (nil in local mode); sent beside cursor on a resume, so the
	// stream resumes on any replica.
	position []byte
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
			f.cursor, f.position = 0, nil
		case codes.DataLoss:
			f.m.followErrors.WithLabelValues("data_loss").Inc()
			f.log.Warn("collector retention removed events before the proxy read them", "err", st.Message())
			continue
		}
		f.m.followErrors.WithLabelValues(strings.ToLower(st.Code().String())).Inc()
		wait := jitter(backoff)
		f.log.Warn("collector follow stream lost; driver traffic is unaffected; the driver's own kubernetes events pass until it is back; retrying",
			"code", st.Code(), "err", st.Message(), "resume_after", f.cursor, "in", wait)
		if !f.wait(ctx, conn, wait) {
			return
		}
		backoff = min(2*backoff, f.cfg.Follow.BackoffMax)
	}
}

// maxProbeEvery bounds the probe interval of wait: a refused connection
// attempt on a collector that is down costs next to nothing.
const maxProbeEvery = 250 * time.Millisecond

// wait sleeps d before the next Follow attempt, or less: while the
// collector connection is down it is probed every follow.backoff_min, at
// most maxProbeEvery (gRPC
// redials at once instead of after its own connect backoff, which grows to
// two minutes), and the wait ends as soon as a probe connects, so a
// collector that is back is followed again within about one probe
// interval, not one back-off. A connection that stays up (the collector
// refused the call itself) is not a signal: then the wait is d. It
// reports false when ctx ended.
func (f *follower) wait(ctx context.Context, conn *grpc.ClientConn, d time.Duration) bool {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if conn == nil {
		<-wctx.Done()
		return ctx.Err() == nil
	}
	probe := time.NewTicker(min(f.cfg.Follow.BackoffMin, maxProbeEvery))
	defer probe.Stop()
	changed := make(chan connectivity.State, 1)
	watchFrom := func(from connectivity.State) {
		go func() {
			if conn.WaitForStateChange(wctx, from) {
				changed <- conn.GetState()
			}
		}()
	}
	st := conn.GetState()
	wasDown := st != connectivity.Ready
	if st == connectivity.Idle {
		conn.Connect()
	}
	watchFrom(st)
	for {
		select {
		case <-wctx.Done():
			return ctx.Err() == nil
		case <-probe.C:
			// A connection waiting out gRPC's connect backoff redials now.
			conn.ResetConnectBackoff()
		case st = <-changed:
			if st == connectivity.Ready && wasDown {
				f.log.Info("collector reachable again; following at once")
				return true
			}
			if st != connectivity.Ready {
				wasDown = true
			}
			if st == connectivity.Idle {
				conn.Connect()
			}
			watchFrom(st)
		}
	}
}

// once runs one Follow subscription; got reports whether the collector
// accepted it.
func (f *follower) once(ctx context.Context, c eventpipev1.FollowClient) (got bool, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &eventpipev1.FollowRequest{GatewayId: f.cfg.GatewayID}
	if f.cursor > 0 || len(f.position) > 0 {
		req.AfterCursor, req.AfterPosition = f.cursor, f.position
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
	fresh := req.AfterCursor == 0 && len(req.AfterPosition) == 0
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, status.Error(codes.Unavailable, "follow stream ended")
		}
		if err != nil {
			return got, err
		}
		f.cursor = m.GetCursor()
		if len(m.GetPosition()) > 0 {
			f.position = m.GetPosition()
		}
		f.m.occurrences.Inc()
		f.hub.applyAt(m.GetPartition(), m.GetCursor(), m.GetOccurrence(), fresh && f.hub.wasRestored(m.GetPartition(), m.GetCursor()))
	}
}

// dial builds the collector connection (TLS unless insecure, optional
// mTLS, the bearer token re-read from its file on every call).
func (f *follower) dial() (*grpc.ClientConn, error) {
	c := f.cfg.Collector
	return collectorclient.Dial(collectorclient.Options{
		Address: c.Address, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		ServerName: c.ServerName, TokenFile: c.TokenFile, Insecure: c.Insecure,
		MaxRecvBytes: maxMsgBytes,
		Names: collectorclient.Names{Address: "collector.address", CA: "collector.ca_file",
			CertKey: "collector.cert_file/key_file", Token: "collector.token_file"},
	})
}

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

// readState reads what a previous run saved as delivered (nil if
// nothing). The file's first line is the cursor of partition 0 (the only
// one of a collector in local mode, as files written before Kafka mode
// hold); each further line is "<partition> <cursor>".
func readState(path string) (delivered, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := delivered{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		line = strings.TrimSpace(line)
		var part int64
		var cur uint64
		if i == 0 {
			cur, err = strconv.ParseUint(line, 10, 64)
		} else if f := strings.Fields(line); len(f) == 2 {
			part, err = strconv.ParseInt(f[0], 10, 32)
			if err == nil {
				cur, err = strconv.ParseUint(f[1], 10, 64)
			}
		} else {
			err = errors.New("want <partition> <cursor>")
		}
		if err != nil {
			return nil, fmt.Errorf("%s line %d: not a cursor: %w", path, i+1, err)
		}
		if cur > 0 {
			d[int32(part)] = cur
		}
	}
	if len(d) == 0 {
		return nil, nil
	}
	return d, nil
}

// writeState saves what was delivered atomically (temp file + rename), in
// readState's format.
func writeState(path string, d delivered) error {
	if path == "" || len(d) == 0 {
		return nil
	}
	var sb strings.Builder
	sb.WriteString(strconv.FormatUint(d[0], 10) + "\n")
	for _, part := range slices.Sorted(maps.Keys(d)) {
		if part != 0 {
			fmt.Fprintf(&sb, "%d %d\n", part, d[part])
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".driver-proxy-state-*")
	if err != nil {
		return err
	}
	_, werr := tmp.WriteString(sb.String())
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
