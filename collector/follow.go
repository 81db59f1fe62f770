package collector

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

// Follow metadata keys. The header is sent before the first message;
// HeaderLostRecords says how many log records after the resume cursor were
// removed by retention before this subscriber could read them (they may or
// may not have matched its selector). It is "0" when nothing was lost.
const (
	HeaderLostRecords = "eventpipe-lost-records"
	HeaderFirstCursor = "eventpipe-first-cursor"
	HeaderLastCursor  = "eventpipe-last-cursor"
	// HeaderTailScannedFrom is set when the tail replay stopped scanning
	// backwards at follow.max_tail_scan records before finding `tail`
	// matches: older matching records may exist before this offset.
	HeaderTailScannedFrom = "eventpipe-tail-scanned-from"
)

// followLog is what the follow stream needs from the durable log.
type followLog interface {
	Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error)
	Wait(ctx context.Context, after uint64) error
	Bounds() (first, last uint64)
}

// followServer implements eventpipe.v1.Follow. Every subscriber reads the
// log itself, chunk by chunk, at the pace its gRPC stream accepts: there is
// no per-subscriber queue to overflow, so a slow subscriber is neither cut
// off nor skipped, and it costs one chunk of memory.
type followServer struct {
	eventpipev1.UnimplementedFollowServer
	log     followLog
	logger  *slog.Logger
	m       *metrics
	chunk   int
	maxTail uint32
	maxScan uint64
	cache   *chunkCache
	// drain is cancelled when the collector starts shutting down: open
	// streams end with Unavailable and resume elsewhere by cursor.
	drain context.Context
}

// selector is a validated FollowRequest selector.
type selector struct {
	sandboxID, workspace, name, gatewayID string
}

func parseSelector(req *eventpipev1.FollowRequest) (selector, error) {
	s := selector{sandboxID: req.GetSandboxId(), workspace: req.GetWorkspace(), name: req.GetSandboxName(), gatewayID: req.GetGatewayId()}
	n := 0
	if s.sandboxID != "" {
		n++
	}
	if s.workspace != "" {
		n++
	}
	if s.gatewayID != "" {
		n++
	}
	switch {
	case n != 1:
		return s, status.Error(codes.InvalidArgument, "exactly one selector: sandbox_id; workspace (+ sandbox_name); or gateway_id")
	case s.name != "" && s.workspace == "":
		return s, status.Error(codes.InvalidArgument, "sandbox_name needs workspace")
	}
	return s, nil
}

// match reports whether o belongs to the selection and the caller may see
// it. Unattributed occurrences (no sandbox id) never match, except the
// agent's supervisor-image check of a gateway (eventpipev1.IsSupervisorCheck):
// a gateway selection carries it to any reader granted a workspace, since a
// bad supervisor image blocks every workspace's next sandbox and names
// nothing of any of them.
func (s selector) match(p *Principal, o *eventpipev1.Occurrence) bool {
	sb := o.GetSandbox()
	if sb.GetId() == "" {
		return s.gatewayID != "" && sb.GetGatewayId() == s.gatewayID && eventpipev1.IsSupervisorCheck(o) && p.mayReadSome()
	}
	switch {
	case s.sandboxID != "":
		if sb.GetId() != s.sandboxID {
			return false
		}
	case s.workspace != "":
		if sb.GetWorkspace() != s.workspace || (s.name != "" && sb.GetName() != s.name) {
			return false
		}
	case s.gatewayID != "":
		if sb.GetGatewayId() != s.gatewayID {
			return false
		}
	default:
		return false
	}
	return p.mayRead(sb.GetWorkspace())
}

func (f *followServer) Follow(req *eventpipev1.FollowRequest, stream eventpipev1.Follow_FollowServer) error {
	return serveFollow(f.drain, stream, func(ctx context.Context) error { return f.follow(ctx, req, stream) })
}

// serveFollow runs one Follow stream (local or Kafka mode) until fn
// returns; when the collector starts shutting down (drain) the stream ends
// with Unavailable so the subscriber resumes elsewhere.
func serveFollow(drain context.Context, stream eventpipev1.Follow_FollowServer, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(drain, cancel)()
	err := fn(ctx)
	if drain.Err() != nil && stream.Context().Err() == nil {
		return status.Error(codes.Unavailable, "collector shutting down: resume with after_cursor (or after_position) set to the last one received")
	}
	return err
}

// admitFollow checks a Follow request the same way in local and Kafka
// mode: exactly one selector, an authenticated principal, the workspace
// grant, the tail limit.
func admitFollow(ctx context.Context, req *eventpipev1.FollowRequest, m *metrics, maxTail uint32) (selector, *Principal, error) {
	sel, err := parseSelector(req)
	if err != nil {
		return sel, nil, err
	}
	p := principalFrom(ctx)
	if p == nil {
		return sel, nil, status.Error(codes.Unauthenticated, "no principal")
	}
	if sel.workspace != "" && !p.mayRead(sel.workspace) {
		m.authFailures.WithLabelValues(authWorkspace).Inc()
		return sel, nil, status.Errorf(codes.PermissionDenied, "%q may not follow workspace %q", p.Name, sel.workspace)
	}
	if req.GetTail() > maxTail {
		return sel, nil, status.Errorf(codes.InvalidArgument, "tail %d exceeds the maximum %d (follow.max_tail)", req.GetTail(), maxTail)
	}
	return sel, p, nil
}

func (f *followServer) follow(ctx context.Context, req *eventpipev1.FollowRequest, stream eventpipev1.Follow_FollowServer) error {
	sel, p, err := admitFollow(ctx, req, f.m, f.maxTail)
	if err != nil {
		return err
	}
	f.m.subscribers.Inc()
	defer f.m.subscribers.Dec()

	first, last := f.log.Bounds()
	var from uint64 // next offset to read
	var replay []sinks.Record
	var lost uint64
	var tailHdr metadata.MD
	switch {
	case req.GetAfterCursor() > last:
		// Cursors come from this log, so one beyond its end means the log
		// was replaced (data directory lost or another collector): waiting
		// for the log to catch up would silently skip what comes before.
		f.m.followCursorAhead.Inc()
		f.logger.Error("follow subscriber resumed from a cursor beyond the end of the log; refused",
			"caller", p.Name, "after_cursor", req.GetAfterCursor(), "log_last", last)
		return status.Errorf(codes.OutOfRange, "after_cursor %d is beyond the end of the log (%d): the log was reset or belongs to another collector; resubscribe with tail or after_cursor <= %d", req.GetAfterCursor(), last, last)
	case req.GetAfterCursor() > 0:
		from = req.GetAfterCursor() + 1
		if first > 0 && from < first {
			// Retention removed what the subscriber had not read yet: say so.
			lost = first - from
		}
	case req.GetTail() > 0:
		var scannedFrom uint64
		replay, scannedFrom, err = f.tail(ctx, sel, p, int(req.GetTail()), first, last)
		if err != nil {
			return err
		}
		if scannedFrom > 0 {
			tailHdr = metadata.Pairs(HeaderTailScannedFrom, strconv.FormatUint(scannedFrom, 10))
		}
		from = last + 1
	default:
		from = last + 1
	}
	if lost > 0 {
		f.m.followLost.Add(float64(lost))
		f.logger.Warn("follow subscriber resumed behind retention; records lost", "caller", p.Name, "after_cursor", req.GetAfterCursor(), "lost_records", lost, "first_offset", first)
	}
	hdr := metadata.Join(metadata.Pairs(HeaderLostRecords, strconv.FormatUint(lost, 10),
		HeaderFirstCursor, strconv.FormatUint(first, 10), HeaderLastCursor, strconv.FormatUint(last, 10)), tailHdr)
	if err := stream.SendHeader(hdr); err != nil {
		return fmt.Errorf("send header: %w", err)
	}
	for _, r := range replay {
		if err := f.send(stream, r); err != nil {
			return err
		}
	}
	if lost > 0 {
		from = first
	}
	return f.stream(ctx, stream, sel, p, from, req.GetNoFollow(), last, lost)
}

func (f *followServer) send(stream grpc.ServerStreamingServer[eventpipev1.FollowResponse], r sinks.Record) error {
	if err := stream.Send(&eventpipev1.FollowResponse{Cursor: r.Offset, Occurrence: r.Occurrence}); err != nil {
		return err
	}
	f.m.followSent.Inc()
	return nil
}

// stream sends every matching record from offset from on: up to snapshot
// and stop when noFollow, else for ever (live, via Wait). Records removed by
// retention while the subscriber was reading end the stream with DataLoss
// naming the count and the cursor to resume from: never a silent gap.
func (f *followServer) stream(ctx context.Context, stream grpc.ServerStreamingServer[eventpipev1.FollowResponse], sel selector, p *Principal, from uint64, noFollow bool, snapshot uint64, lostBefore uint64) error {
	var sent uint64 // cursor of the last record read (matching or not)
	if from > 0 {
		sent = from - 1
	}
	if lostBefore > 0 {
		stream.SetTrailer(metadata.Pairs(HeaderLostRecords, strconv.FormatUint(lostBefore, 10)))
	}
	for {
		if noFollow && from > snapshot {
			return nil
		}
		recs, skipped, err := f.cache.Read(ctx, from)
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return status.Errorf(codes.Unavailable, "read log at %d: %v", from, err)
		}
		if skipped > 0 {
			f.m.followLost.Add(float64(skipped))
			f.logger.Warn("follow subscriber fell behind retention; records lost", "caller", p.Name, "from", from, "lost_records", skipped)
			return status.Errorf(codes.DataLoss, "%d log records after cursor %d were removed by retention before they were read; resume with after_cursor=%d to continue (the loss is reported again in the %s header)", skipped, sent, sent, HeaderLostRecords)
		}
		if len(recs) == 0 {
			if noFollow {
				return nil
			}
			if err := f.log.Wait(ctx, from-1); err != nil {
				if ctx.Err() != nil {
					return status.FromContextError(ctx.Err()).Err()
				}
				return status.Errorf(codes.Unavailable, "wait for log: %v", err)
			}
			continue
		}
		for _, r := range recs {
			if noFollow && r.Offset > snapshot {
				return nil
			}
			if sel.match(p, r.Occurrence) {
				if err := f.send(stream, r); err != nil {
					return err
				}
			}
			sent = r.Offset
		}
		from = recs[len(recs)-1].Offset + 1
	}
}

// tail returns the last n matching records at or before last, in offset
// order, scanning the log backwards one chunk at a time: memory stays at one
// chunk plus n records, whatever the log's size. The scan stops after
// f.maxScan records; scannedFrom is then the oldest offset scanned (0 when
// the scan was complete), and the caller tells the subscriber.
func (f *followServer) tail(ctx context.Context, sel selector, p *Principal, n int, first, last uint64) (_ []sinks.Record, scannedFrom uint64, _ error) {
	if last == 0 || n == 0 || last < first {
		return nil, 0, nil
	}
	if first == 0 {
		first = 1
	}
	var out []sinks.Record // newest first
	var scanned uint64
	end := last
	for len(out) < n && end >= first {
		if scanned >= f.maxScan {
			scannedFrom = end + 1
			break
		}
		start := first
		if end-first+1 > uint64(f.chunk) {
			start = end - uint64(f.chunk) + 1
		}
		recs, _, err := f.log.Read(ctx, start, int(end-start+1))
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, status.FromContextError(ctx.Err()).Err()
			}
			return nil, 0, status.Errorf(codes.Unavailable, "read log at %d: %v", start, err)
		}
		scanned += end - start + 1
		for i := len(recs) - 1; i >= 0 && len(out) < n; i-- {
			if recs[i].Offset <= end && sel.match(p, recs[i].Occurrence) {
				out = append(out, recs[i])
			}
		}
		if start == first {
			break
		}
		end = start - 1
	}
	slices.Reverse(out)
	return out, scannedFrom, nil
}
