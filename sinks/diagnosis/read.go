package diagnosis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Follow header keys (the collector's; repeated here so this package does
// not import the collector).
const (
	headerLostRecords     = "eventpipe-lost-records"
	headerLastCursor      = "eventpipe-last-cursor"
	headerTailScannedFrom = "eventpipe-tail-scanned-from"
	// headerLastPosition: collectors in Kafka mode only (binary).
	headerLastPosition = "eventpipe-last-position-bin"
)

// ReadInfo is what the collector said about a replay besides the
// occurrences.
type ReadInfo struct {
	// LastCursor is the log's end when the replay started.
	LastCursor uint64
	// LastPosition is LastCursor's counterpart from collectors in Kafka
	// mode (nil in local mode): resume with it as after_position.
	LastPosition []byte
	// LostRecords were removed by retention before they could be read.
	LostRecords uint64
	// TailScannedFrom > 0: the collector stopped looking for older
	// occurrences there (follow.max_tail_scan); older ones may exist.
	TailScannedFrom uint64
	// Read is the number of occurrences received.
	Read int
}

// Read replays req once (no_follow is forced) into a new Folder. Errors are
// the stream's gRPC status errors, unchanged, so a caller can tell a
// refusal (Unauthenticated, PermissionDenied, InvalidArgument) from an
// unreachable collector (Unavailable).
func Read(ctx context.Context, client eventpipev1.FollowClient, req *eventpipev1.FollowRequest) (*Folder, ReadInfo, error) {
	f := NewFolder()
	info, err := readInto(ctx, client, req, f)
	return f, info, err
}

func readInto(ctx context.Context, client eventpipev1.FollowClient, req *eventpipev1.FollowRequest, f *Folder) (ReadInfo, error) {
	var info ReadInfo
	r := cloneRequest(req)
	r.NoFollow = true
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Follow(ctx, r)
	if err != nil {
		return info, err
	}
	if hdr, err := stream.Header(); err == nil {
		info.LastCursor = mdUint(hdr, headerLastCursor)
		info.LastPosition = mdBytes(hdr, headerLastPosition)
		info.LostRecords = mdUint(hdr, headerLostRecords)
		info.TailScannedFrom = mdUint(hdr, headerTailScannedFrom)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return info, nil
		}
		if err != nil {
			return info, err
		}
		info.Read++
		f.Add(m.GetCursor(), m.GetOccurrence())
	}
}

func cloneRequest(req *eventpipev1.FollowRequest) *eventpipev1.FollowRequest {
	return &eventpipev1.FollowRequest{SandboxId: req.GetSandboxId(), Workspace: req.GetWorkspace(),
		SandboxName: req.GetSandboxName(), GatewayId: req.GetGatewayId(), Tail: req.GetTail(),
		AfterCursor: req.GetAfterCursor(), AfterPosition: req.GetAfterPosition(), NoFollow: req.GetNoFollow()}
}

// mdBytes is a binary (-bin) metadata value, nil when absent.
func mdBytes(md metadata.MD, key string) []byte {
	v := md.Get(key)
	if len(v) == 0 || v[0] == "" {
		return nil
	}
	return []byte(v[0])
}

func mdUint(md metadata.MD, key string) uint64 {
	v := md.Get(key)
	if len(v) == 0 {
		return 0
	}
	n, _ := strconv.ParseUint(v[0], 10, 64)
	return n
}

// Refused reports whether err is the collector refusing the request
// (credentials, workspace, request): retrying the same request cannot help.
func Refused(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.OutOfRange:
		return true
	}
	return false
}

// WatchOptions tune a Watcher.
type WatchOptions struct {
	// Logger receives reconnects and losses; nil discards.
	Logger *slog.Logger
	// BackoffMin/BackoffMax pace resubscriptions (defaults 250ms, 10s).
	BackoffMin, BackoffMax time.Duration
}

// WatchStatus is the Watcher's connection state.
type WatchStatus struct {
	Connected bool
	// Cursor is the last position read (resume point).
	Cursor uint64
	// Position is the resume point from collectors in Kafka mode (opaque;
	// nil in local mode). A resubscription sends it beside Cursor, so it
	// resumes on any replica.
	Position []byte
	// LostRecords counts records retention removed before they were read.
	LostRecords uint64
	// Reconnects counts resubscriptions after a broken stream.
	Reconnects int
	// LastError is the last stream error ("" when none).
	LastError string
}

// Watcher follows a selection live and keeps its diagnoses current.
type Watcher struct {
	client eventpipev1.FollowClient
	req    *eventpipev1.FollowRequest
	opts   WatchOptions

	mu      sync.Mutex
	folder  *Folder
	status  WatchStatus
	changed chan struct{}
}

// NewWatcher returns a Watcher over req (its selector and tail; after_cursor
// is where it starts when set). Call Run.
func NewWatcher(client eventpipev1.FollowClient, req *eventpipev1.FollowRequest, opts WatchOptions) (*Watcher, error) {
	if client == nil {
		return nil, errors.New("diagnosis: nil FollowClient")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = 250 * time.Millisecond
	}
	if opts.BackoffMax < opts.BackoffMin {
		opts.BackoffMax = max(10*time.Second, opts.BackoffMin)
	}
	return &Watcher{client: client, req: cloneRequest(req), opts: opts, folder: NewFolder(), changed: make(chan struct{}, 1)}, nil
}

// Changed is signalled (non-blocking, coalesced) after a diagnosis changed
// or the connection state did.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

func (w *Watcher) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Sandboxes returns a copy of every diagnosis (see Folder.Sandboxes).
func (w *Watcher) Sandboxes() []Diagnosis {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.folder.Sandboxes()
}

// SupervisorChecks is Folder.SupervisorChecks of the watched selection.
func (w *Watcher) SupervisorChecks() []SupervisorCheck {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.folder.SupervisorChecks()
}

// Dropped is Folder.Dropped of the watched selection.
func (w *Watcher) Dropped() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.folder.Dropped()
}

// Status returns the connection state.
func (w *Watcher) Status() WatchStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Run follows until ctx ends (nil) or the collector refuses the request
// (the refusal). A broken stream or an unreachable collector is retried
// with backoff, resuming after the last cursor read.
func (w *Watcher) Run(ctx context.Context) error {
	backoff := w.opts.BackoffMin
	for {
		got, err := w.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if Refused(err) && status.Code(err) != codes.OutOfRange {
			return fmt.Errorf("follow: %w", err)
		}
		if status.Code(err) == codes.OutOfRange {
			// The log was reset under us: start again from its tail.
			w.mu.Lock()
			w.status.Cursor, w.status.Position = 0, nil
			w.mu.Unlock()
		}
		if got {
			backoff = w.opts.BackoffMin
		}
		w.mu.Lock()
		w.status.Connected = false
		w.status.Reconnects++
		if err != nil {
			w.status.LastError = err.Error()
		}
		w.mu.Unlock()
		w.notify()
		wait := backoff - backoff/5 + time.Duration(rand.Int64N(int64(backoff/5)*2+1))
		w.opts.Logger.Info("follow stream ended; resubscribing", "err", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, w.opts.BackoffMax)
	}
}

// once runs one subscription; got reports whether the collector accepted it.
func (w *Watcher) once(ctx context.Context) (got bool, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := cloneRequest(w.req)
	r.NoFollow = false
	w.mu.Lock()
	if w.status.Cursor > 0 || len(w.status.Position) > 0 {
		r.AfterCursor, r.AfterPosition, r.Tail = w.status.Cursor, w.status.Position, 0
	}
	w.mu.Unlock()
	stream, err := w.client.Follow(ctx, r)
	if err != nil {
		return false, err
	}
	hdr, err := stream.Header()
	if err != nil {
		return false, err
	}
	if len(hdr.Get(headerLastCursor)) == 0 {
		// A refusal arrives without the header: Recv returns it.
		_, err := stream.Recv()
		return false, err
	}
	lost := mdUint(hdr, headerLostRecords)
	w.mu.Lock()
	w.status.Connected, w.status.LastError = true, ""
	w.status.LostRecords += lost
	if w.status.Cursor == 0 && len(w.status.Position) == 0 && r.GetAfterCursor() == 0 && len(r.GetAfterPosition()) == 0 {
		// Nothing read yet: resume after the log's end at subscription
		// time (the tail replay covers what came before).
		w.status.Cursor = mdUint(hdr, headerLastCursor)
		w.status.Position = mdBytes(hdr, headerLastPosition)
	}
	w.mu.Unlock()
	if lost > 0 {
		w.opts.Logger.Warn("follow: records removed by retention before they were read", "lost", lost)
	}
	w.notify()
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return true, err
		}
		w.mu.Lock()
		changed := w.folder.Add(m.GetCursor(), m.GetOccurrence())
		switch {
		case len(m.GetPosition()) > 0:
			// Kafka mode: cursors count within a partition; the position
			// is the resume point.
			w.status.Position, w.status.Cursor = m.GetPosition(), m.GetCursor()
		case m.GetCursor() > w.status.Cursor:
			w.status.Cursor = m.GetCursor()
		}
		w.mu.Unlock()
		if changed {
			w.notify()
		}
	}
}
