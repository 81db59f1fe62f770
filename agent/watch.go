package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

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

// watcher drives the one cluster-wide list+watch of core/v1 Events.
type watcher struct {
	cfg   WatchConfig
	cs    kubernetes.Interface
	out   chan<- item
	log   *slog.Logger
	m     *metrics
	alive *atomic.Int64 // unix nanos of the last notification (readiness)

	noWatchList bool
}

// run reads Events from startRV ("" = list everything first) until ctx ends.
func (w *watcher) run(ctx context.Context, startRV string) error {
	rv := startRV
	backoff := w.cfg.BackoffInitial
	for ctx.Err() == nil {
		var err error
		if rv == "" {
			if w.cfg.WatchList && !w.noWatchList {
				rv, err = w.watchList(ctx)
			} else {
				rv, err = w.list(ctx)
				if err == nil {
					rv, err = w.watch(ctx, rv)
				}
			}
		} else {
			rv, err = w.watch(ctx, rv)
		}
		switch {
		case err == nil:
			backoff = w.cfg.BackoffInitial
			continue
		case ctx.Err() != nil:
			return nil
		case isExpired(err):
			w.m.expired.Inc()
			w.log.Info("event watch resourceVersion expired; relisting", "err", err)
			rv = ""
			backoff = w.cfg.BackoffInitial
			continue
		}
		w.m.watchErrors.Inc()
		w.log.Warn("event watch failed; retrying", "err", err, "backoff", backoff)
		if !sleepCtx(ctx, jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, w.cfg.BackoffMax)
	}
	return nil
}

func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// errExpired is returned by consume when the stream reported 410 Gone.
var errExpired = apierrors.NewResourceExpired("event watch: resourceVersion too old")

func (w *watcher) timeout() *int64 {
	s := int64((w.cfg.MinWatchTimeout + time.Duration(rand.Int64N(int64(w.cfg.MinWatchTimeout)))).Seconds())
	return &s
}

// watchList lists through a watch with sendInitialEvents: the initial Events
// are streamed (served from the watch cache), then a bookmark marks their end
// and the same watch goes on. It returns the resourceVersion to resume from,
// or "" when the listing did not complete.
func (w *watcher) watchList(ctx context.Context) (string, error) {
	t := true
	wi, err := w.cs.CoreV1().Events("").Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    &t,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
		TimeoutSeconds:       w.timeout(),
	})
	if err != nil {
		if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || isWatchListRefusal(err) {
			w.log.Info("watch-list refused by the API server; falling back to paginated LIST", "err", err)
			w.noWatchList = true
			return "", nil
		}
		return "", fmt.Errorf("watch-list events: %w", err)
	}
	w.m.relists.WithLabelValues("watchlist").Inc()
	return w.consume(ctx, wi, "", true)
}

func isWatchListRefusal(err error) bool {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		if d := se.Status().Details; d != nil {
			for _, c := range d.Causes {
				if c.Field == "sendInitialEvents" {
					return true
				}
			}
		}
	}
	return false
}

// list pages through all Events (served from the watch cache on current API
// servers) and returns the listing's resourceVersion.
func (w *watcher) list(ctx context.Context) (string, error) {
	w.m.relists.WithLabelValues("list").Inc()
	opts := metav1.ListOptions{Limit: w.cfg.ListPageSize}
	var listRV string
	for {
		l, err := w.cs.CoreV1().Events("").List(ctx, opts)
		if err != nil {
			if isExpired(err) && opts.Continue != "" {
				// The continue token expired: start the listing again.
				opts.Continue = ""
				continue
			}
			return "", fmt.Errorf("list events: %w", err)
		}
		if listRV == "" {
			listRV = l.ResourceVersion
		}
		for i := range l.Items {
			if !w.send(ctx, w.eventItem(&l.Items[i], false, true)) {
				return "", ctx.Err()
			}
		}
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	if !w.send(ctx, item{kind: itemListEnd, rv: listRV}) {
		return "", ctx.Err()
	}
	w.alive.Store(time.Now().UnixNano())
	return listRV, nil
}

// watch follows Events from rv until the server ends the watch (then it
// returns the last resourceVersion seen) or fails.
func (w *watcher) watch(ctx context.Context, rv string) (string, error) {
	wi, err := w.cs.CoreV1().Events("").Watch(ctx, metav1.ListOptions{
		ResourceVersion:     rv,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      w.timeout(),
	})
	if err != nil {
		return rv, fmt.Errorf("watch events from %s: %w", rv, err)
	}
	w.alive.Store(time.Now().UnixNano())
	return w.consume(ctx, wi, rv, false)
}

// consume reads one watch stream. In listing mode (a watch-list) Events are
// "listed" until the initial-events-end bookmark; if the stream ends before
// it, "" is returned so the listing starts again.
func (w *watcher) consume(ctx context.Context, wi watch.Interface, rv string, listing bool) (string, error) {
	defer wi.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return rv, ctx.Err()
		case ev, ok = <-wi.ResultChan():
		}
		if !ok {
			if listing {
				return "", errors.New("watch-list ended before its initial events did")
			}
			w.alive.Store(time.Now().UnixNano())
			return rv, nil
		}
		w.alive.Store(time.Now().UnixNano())
		w.m.watchEvents.WithLabelValues(watchTypeLabel(string(ev.Type))).Inc()
		switch ev.Type {
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			if isExpired(err) {
				return "", errExpired
			}
			return rv, fmt.Errorf("event watch error: %w", err)
		case watch.Bookmark:
			mo, err := metaOf(ev.Object)
			if err != nil {
				continue
			}
			brv := mo.GetResourceVersion()
			if listing {
				if mo.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
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
		case watch.Added, watch.Modified, watch.Deleted:
			e, isEvent := ev.Object.(*corev1.Event)
			if !isEvent {
				w.m.skipped.WithLabelValues("bad_object").Inc()
				w.log.Warn("event watch returned a non-Event object", "type", fmt.Sprintf("%T", ev.Object))
				continue
			}
			var it item
			if ev.Type == watch.Deleted {
				it = item{kind: itemDeleted, rv: e.ResourceVersion, ev: &enrich.Event{UID: string(e.UID)}}
			} else {
				it = w.eventItem(e, ev.Type == watch.Modified, listing)
			}
			if listing {
				it.rv = ""
			} else {
				rv = e.ResourceVersion
			}
			if !w.send(ctx, it) {
				return rv, ctx.Err()
			}
		}
	}
}

func (w *watcher) send(ctx context.Context, it item) bool {
	select {
	case w.out <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *watcher) eventItem(e *corev1.Event, modified, listed bool) item {
	ev := toEnrichEvent(e)
	rv := e.ResourceVersion
	if listed {
		rv = ""
	}
	return item{kind: itemEvent, modified: modified, listed: listed, rv: rv, ev: ev, fp: fingerprint(ev, e), observed: time.Now()}
}

// toEnrichEvent normalises a core/v1 Event (which also carries the
// events.k8s.io fields) into enrich's input.
func toEnrichEvent(e *corev1.Event) *enrich.Event {
	out := &enrich.Event{
		APIVersion: "v1", Namespace: e.Namespace, Name: e.Name, UID: string(e.UID), ResourceVersion: e.ResourceVersion,
		Involved: enrich.ObjectRef{
			Kind: e.InvolvedObject.Kind, APIVersion: e.InvolvedObject.APIVersion, Namespace: e.InvolvedObject.Namespace,
			Name: e.InvolvedObject.Name, UID: string(e.InvolvedObject.UID), FieldPath: e.InvolvedObject.FieldPath,
		},
		Type: e.Type, Reason: e.Reason, Message: e.Message, Action: e.Action, Count: e.Count,
		FirstTimestamp: e.FirstTimestamp.Time, LastTimestamp: e.LastTimestamp.Time, EventTime: e.EventTime.Time,
		ReportingComponent: e.Source.Component, ReportingInstance: e.Source.Host,
	}
	if e.Series != nil {
		out.Count = e.Series.Count
		out.SeriesLastObserved = e.Series.LastObservedTime.Time
	}
	if out.ReportingComponent == "" {
		out.ReportingComponent = e.ReportingController
	}
	if out.ReportingInstance == "" {
		out.ReportingInstance = e.ReportingInstance
	}
	return out
}

// fingerprint covers what makes a MODIFIED a new occurrence: count,
// series.count and the message (not series.lastObservedTime, which the
// 30-minute series heartbeat moves alone).
func fingerprint(ev *enrich.Event, e *corev1.Event) uint64 {
	h := uint64(14695981039346656037)
	mix := func(b byte) { h ^= uint64(b); h *= 1099511628211 }
	for _, v := range []int32{e.Count, seriesCount(e)} {
		for i := 0; i < 4; i++ {
			mix(byte(v >> (8 * i)))
		}
	}
	for i := 0; i < len(ev.Message); i++ {
		mix(ev.Message[i])
	}
	return h
}

func seriesCount(e *corev1.Event) int32 {
	if e.Series == nil {
		return -1
	}
	return e.Series.Count
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
