package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/eventpipe/eventpipe/agent/internal/kwire"
	"github.com/eventpipe/eventpipe/enrich"
)

type itemKind uint8

const (
	itemEvent    itemKind = iota // an Event from a watch or a listing
	itemDeleted                  // a deleted Event: not an occurrence, moves the cursor
	itemBookmark                 // a bookmark: moves the cursor
	itemListEnd                  // end of a listing: rv is the listing's resourceVersion
)

// item is what the watch reader hands the processor. rv is the cursor the
// agent may resume from once this item and all before it are shipped; it is
// empty for Events of a listing (their resourceVersions are not ordered),
// whose cursor is the itemListEnd that follows them.
type item struct {
	kind     itemKind
	modified bool
	listed   bool
	rv       string
	ev       *enrich.Event
	fp       uint64
	observed time.Time
}

// itemQueue carries watch items to the processor in chunks: one channel
// operation, and at most one wake-up of the processor, per chunk instead of
// per Event. The watcher hands a chunk over when it is full or before it
// would wait for the stream, so a chunk never waits for more data. The
// capacity (watch.queue_capacity) is in items, rounded to whole chunks.
type itemQueue struct {
	ch   chan []item
	free chan []item
	n    atomic.Int64 // items queued, for the queue-length gauge
}

const queueChunk = 64

func newItemQueue(capacity int) *itemQueue {
	chunks := max(1, capacity/queueChunk)
	return &itemQueue{ch: make(chan []item, chunks), free: make(chan []item, chunks+2)}
}

func (q *itemQueue) get() []item {
	select {
	case s := <-q.free:
		return s
	default:
		return make([]item, 0, queueChunk)
	}
}

// done gives a processed chunk back for reuse.
func (q *itemQueue) done(s []item) {
	q.n.Add(-int64(len(s)))
	clear(s)
	select {
	case q.free <- s[:0]:
	default:
	}
}

// watcher drives the one cluster-wide list+watch of core/v1 Events.
type watcher struct {
	cfg   WatchConfig
	kc    *kubeClient
	out   *itemQueue
	log   *slog.Logger
	m     *metrics
	alive *atomic.Int64 // unix nanos of the last notification (readiness)

	noWatchList bool
	pending     []item       // items not handed to the processor yet
	ev          kwire.Event  // decode target, reused
	buf         bytes.Buffer // LIST body, reused across pages
}

var eventsResource = apiResource{version: "v1", resource: "events"}

// run reads Events from startRV ("" = list everything first) until ctx ends.
func (w *watcher) run(ctx context.Context, startRV string) error {
	relist := func(ctx context.Context) (string, error) {
		if w.cfg.WatchList && !w.noWatchList {
			return w.watchList(ctx)
		}
		rv, err := w.list(ctx)
		if err != nil {
			return rv, err
		}
		return w.watch(ctx, rv)
	}
	// Whatever ends a listing or a watch, the items read before it are
	// handed over before the next one starts from the resourceVersion they
	// moved.
	listWatch(ctx, w.cfg, w.log.With("resource", "v1/events"), w.m, startRV,
		func(ctx context.Context) (string, error) {
			rv, err := relist(ctx)
			return w.flushAfter(ctx, rv, err)
		},
		func(ctx context.Context, rv string) (string, error) {
			rv, err := w.watch(ctx, rv)
			return w.flushAfter(ctx, rv, err)
		})
	return nil
}

// errExpired is returned by consume when the stream reported 410 Gone.
var errExpired = &apiError{op: "watch v1/events", code: http.StatusGone, reason: "Expired", msg: "resourceVersion too old"}

// watchList lists through a watch with sendInitialEvents: the initial Events
// are streamed (served from the watch cache), then a bookmark marks their end
// and the same watch goes on. It returns the resourceVersion to resume from,
// or "" when the listing did not complete.
func (w *watcher) watchList(ctx context.Context) (string, error) {
	s, err := w.kc.watch(ctx, eventsResource, listOptions{
		sendInitialEvents:    true,
		resourceVersionMatch: "NotOlderThan",
		allowBookmarks:       true,
		timeoutSeconds:       watchTimeout(w.cfg),
	})
	if err != nil {
		if isBadRequest(err) || isInvalid(err) || isWatchListRefusal(err) {
			w.log.Info("watch-list refused by the API server; falling back to paginated LIST", "err", err)
			w.noWatchList = true
			return "", nil
		}
		return "", fmt.Errorf("watch-list events: %w", err)
	}
	w.m.relists.WithLabelValues("watchlist").Inc()
	return w.consume(ctx, s, "", true)
}

// list pages through all Events (served from the watch cache on current API
// servers) and returns the listing's resourceVersion.
func (w *watcher) list(ctx context.Context) (string, error) {
	w.m.relists.WithLabelValues("list").Inc()
	opts := listOptions{limit: w.cfg.ListPageSize}
	var listRV string
	for {
		lm, err := w.kc.list(ctx, eventsResource, opts, &w.buf, func(raw []byte) error {
			it, ok := w.decodeItem(raw, false, true)
			if ok && !w.send(ctx, it) {
				return ctx.Err()
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			if isExpired(err) && opts.continueToken != "" {
				// The continue token expired: start the listing again.
				opts.continueToken = ""
				continue
			}
			return "", fmt.Errorf("list events: %w", err)
		}
		if listRV == "" {
			listRV = lm.ResourceVersion
		}
		if lm.Continue == "" {
			break
		}
		opts.continueToken = lm.Continue
		if !w.flush(ctx) { // before waiting for the next page
			return "", ctx.Err()
		}
	}
	w.buf = bytes.Buffer{} // do not keep a large page's buffer
	if !w.send(ctx, item{kind: itemListEnd, rv: listRV}) {
		return "", ctx.Err()
	}
	w.alive.Store(time.Now().UnixNano())
	return listRV, nil
}

// watch follows Events from rv until the server ends the watch (then it
// returns the last resourceVersion seen) or fails.
func (w *watcher) watch(ctx context.Context, rv string) (string, error) {
	s, err := w.kc.watch(ctx, eventsResource, listOptions{
		resourceVersion: rv,
		allowBookmarks:  true,
		timeoutSeconds:  watchTimeout(w.cfg),
	})
	if err != nil {
		return rv, fmt.Errorf("watch events from %s: %w", rv, err)
	}
	w.alive.Store(time.Now().UnixNano())
	return w.consume(ctx, s, rv, false)
}

// consume reads one watch stream. In listing mode (a watch-list) Events are
// "listed" until the initial-events-end bookmark; if the stream ends before
// it, "" is returned so the listing starts again.
func (w *watcher) consume(ctx context.Context, s *watchStream, rv string, listing bool) (string, error) {
	defer s.close()
	stop := context.AfterFunc(ctx, s.close) // unblocks a read in progress
	defer stop()
	for {
		if len(w.pending) > 0 && !s.buffered() && !w.flush(ctx) {
			return rv, ctx.Err()
		}
		typ, obj, err := s.next()
		if ctx.Err() != nil {
			return rv, ctx.Err()
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if listing {
					return "", errors.New("watch-list ended before its initial events did")
				}
				w.alive.Store(time.Now().UnixNano())
				return rv, nil
			}
			if isExpired(err) {
				w.m.watchEvents.WithLabelValues(watchTypeLabel(watchError)).Inc()
				return "", errExpired
			}
			if _, ok := asAPIError(err); ok {
				w.m.watchEvents.WithLabelValues(watchTypeLabel(watchError)).Inc()
				return rv, fmt.Errorf("event watch error: %w", err)
			}
			return rv, err
		}
		w.alive.Store(time.Now().UnixNano())
		w.m.watchEvents.WithLabelValues(watchTypeLabel(typ)).Inc()
		switch typ {
		case watchBookmark:
			brv, end, err := s.bookmarkInfo(obj)
			if err != nil {
				w.badObject(err)
				continue
			}
			if listing {
				if !end {
					continue
				}
				listing = false
				if !w.send(ctx, item{kind: itemListEnd, rv: brv}) {
					return "", ctx.Err()
				}
			} else if !w.send(ctx, item{kind: itemBookmark, rv: brv}) {
				return rv, ctx.Err()
			}
			rv = brv
		case watchAdded, watchModified, watchDeleted:
			var it item
			if typ == watchDeleted {
				if err := kwire.DecodeEvent(obj, &w.ev); err != nil {
					w.badObject(err)
					continue
				}
				it = item{kind: itemDeleted, rv: w.ev.ResourceVersion, ev: &enrich.Event{UID: w.ev.UID}}
			} else {
				var ok bool
				if it, ok = w.decodeItem(obj, typ == watchModified, listing); !ok {
					continue
				}
			}
			if listing {
				it.rv = ""
			} else if it.rv != "" {
				rv = it.rv
			}
			if !w.send(ctx, it) {
				return rv, ctx.Err()
			}
		}
	}
}

func (w *watcher) badObject(err error) {
	w.m.skipped.WithLabelValues("bad_object").Inc()
	w.log.Warn("event watch returned an object that could not be decoded; skipped", "err", err)
}

// send queues it for the processor; a full chunk is handed over (blocking
// while the processor is behind: the API server keeps the rest).
func (w *watcher) send(ctx context.Context, it item) bool {
	if w.pending == nil {
		w.pending = w.out.get()
	}
	w.pending = append(w.pending, it)
	if len(w.pending) >= queueChunk {
		return w.flush(ctx)
	}
	return true
}

func (w *watcher) flushAfter(ctx context.Context, rv string, err error) (string, error) {
	if !w.flush(ctx) {
		return rv, ctx.Err()
	}
	return rv, err
}

// flush hands the pending items to the processor; false when ctx ended.
func (w *watcher) flush(ctx context.Context) bool {
	if len(w.pending) == 0 {
		return true
	}
	select {
	case w.out.ch <- w.pending:
		w.out.n.Add(int64(len(w.pending)))
		w.pending = nil
		return true
	case <-ctx.Done():
		return false
	}
}

// decodeItem decodes one core/v1 Event into a watch item.
func (w *watcher) decodeItem(raw []byte, modified, listed bool) (item, bool) {
	if err := kwire.DecodeEvent(raw, &w.ev); err != nil {
		w.badObject(err)
		return item{}, false
	}
	ev := new(enrich.Event)
	*ev = w.ev.Event
	rv := ev.ResourceVersion
	if listed {
		rv = ""
	}
	return item{kind: itemEvent, modified: modified, listed: listed, rv: rv, ev: ev, fp: fingerprint(ev, w.ev.Count, w.ev.SeriesCount), observed: time.Now()}, true
}

// fingerprint covers what makes a MODIFIED a new occurrence: count,
// series.count and the message (not series.lastObservedTime, which the
// 30-minute series heartbeat moves alone). seriesCount is -1 without a
// series.
func fingerprint(ev *enrich.Event, count, seriesCount int32) uint64 {
	h := uint64(14695981039346656037)
	mix := func(b byte) { h ^= uint64(b); h *= 1099511628211 }
	for _, v := range []int32{count, seriesCount} {
		for i := 0; i < 4; i++ {
			mix(byte(v >> (8 * i)))
		}
	}
	for i := 0; i < len(ev.Message); i++ {
		mix(ev.Message[i])
	}
	return h
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
