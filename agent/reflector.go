package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// objKey is a cached object's identity. It shares the strings of the cached
// object's Meta, so the key costs no copy (a "ns/name" string would).
type objKey struct{ ns, name string }

func (k objKey) String() string { return nsKey(k.ns, k.name) }

// objStore is the cache of one kind: the enrich view of every object, by
// namespace/name and (optionally) by UID. Safe for concurrent use; values
// are read-only once stored.
type objStore struct {
	mu    sync.RWMutex
	items map[objKey]*cached
	byUID map[string]*cached // nil unless indexed by UID
}

func newObjStore(uidIndex bool) *objStore {
	s := &objStore{items: map[objKey]*cached{}}
	if uidIndex {
		s.byUID = map[string]*cached{}
	}
	return s
}

func (s *objStore) get(k objKey) (*cached, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, ok := s.items[k]
	return c, ok
}

func (s *objStore) getByUID(uid string) (*cached, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, ok := s.byUID[uid]
	return c, ok
}

func (s *objStore) len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.items)
}

// put stores c (stamped with gen) and returns the object it replaced.
func (s *objStore) put(c *cached, gen uint32) (old *cached) {
	m := c.meta()
	k := objKey{m.Namespace, m.Name}
	c.gen = gen
	s.mu.Lock()
	defer s.mu.Unlock()
	old = s.items[k]
	s.items[k] = c
	if s.byUID != nil {
		if old != nil && old.meta().UID != m.UID {
			delete(s.byUID, old.meta().UID)
		}
		s.byUID[m.UID] = c
	}
	return old
}

// touch re-stamps the stored object with gen (a relisted object that did
// not change) and reports whether it is stored with that resourceVersion.
func (s *objStore) touch(k objKey, rv string, gen uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.items[k]
	if !ok || c.meta().ResourceVersion != rv {
		return false
	}
	c.gen = gen
	return true
}

// remove deletes the object stored under k, unless it has another uid
// than uid (a newer object of the same name; "" matches any).
func (s *objStore) remove(k objKey, uid string) (*cached, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.items[k]
	if !ok || (uid != "" && c.meta().UID != "" && c.meta().UID != uid) {
		return nil, false
	}
	delete(s.items, k)
	if s.byUID != nil && s.byUID[c.meta().UID] == c {
		delete(s.byUID, c.meta().UID)
	}
	return c, true
}

// matching returns the stored objects keep accepts; keep runs under the
// read lock and must not use the store. The caller reads the result
// without the lock, so it may look other objects up meanwhile.
func (s *objStore) matching(keep func(*cached) bool) []*cached {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*cached
	for _, c := range s.items {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// stale removes and returns the objects not stamped with gen: those a
// completed relisting did not contain (deleted while the watch was down).
func (s *objStore) stale(gen uint32) []*cached {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*cached
	for k, c := range s.items {
		if c.gen != gen {
			out = append(out, c)
			delete(s.items, k)
			if s.byUID != nil && s.byUID[c.meta().UID] == c {
				delete(s.byUID, c.meta().UID)
			}
		}
	}
	return out
}

// storeHandler is told of every change of a store (never with I/O inside).
type storeHandler interface {
	added(c *cached)
	updated(old, c *cached)
	deleted(c *cached)
}

// reflector keeps one objStore in step with the API server: a listing
// (watch-list when served, else paginated LIST), then a watch from its
// resourceVersion; on 410 Gone a new listing, whose missing objects are
// reported deleted. It is client-go's reflector without the full typed
// objects: each notification is decoded straight into the cached view.
type reflector struct {
	client  *kubeClient
	res     apiResource
	decode  func(raw []byte) (*cached, error)
	store   *objStore
	h       storeHandler
	cfg     WatchConfig
	log     *slog.Logger
	m       *metrics
	label   string // metrics label of the kind
	noWList bool

	gen    uint32
	synced atomic.Bool
	buf    bytes.Buffer // LIST body, reused across pages
}

func (r *reflector) hasSynced() bool { return r.synced.Load() }

// run lists and watches until ctx ends.
func (r *reflector) run(ctx context.Context) {
	listWatch(ctx, r.cfg, r.log.With("resource", r.res.String()), r.m, "", r.relist, r.watch)
}

// listWatch is the loop both the Event watcher and the cache reflectors
// run: list when there is no resourceVersion (relist), else watch from it;
// on 410 Gone list again; on other errors back off (jittered, doubling up to
// BackoffMax). It returns when ctx ends.
func listWatch(ctx context.Context, cfg WatchConfig, log *slog.Logger, m *metrics, rv string,
	relist func(context.Context) (string, error), watch func(context.Context, string) (string, error)) {
	backoff := cfg.BackoffInitial
	for ctx.Err() == nil {
		var err error
		if rv == "" {
			rv, err = relist(ctx)
		} else {
			rv, err = watch(ctx, rv)
		}
		switch {
		case err == nil:
			backoff = cfg.BackoffInitial
			continue
		case ctx.Err() != nil:
			return
		case isExpired(err):
			m.expired.Inc()
			log.Info("watch resourceVersion expired; relisting", "err", err)
			rv = ""
			backoff = cfg.BackoffInitial
			continue
		}
		m.watchErrors.Inc()
		log.Warn("list/watch failed; retrying", "err", err, "backoff", backoff)
		if !sleepCtx(ctx, jitter(backoff)) {
			return
		}
		backoff = min(backoff*2, cfg.BackoffMax)
	}
}

// relist reads every object and returns the resourceVersion to watch from
// ("" with a nil error when a watch-list was refused: list again by pages).
func (r *reflector) relist(ctx context.Context) (string, error) {
	r.gen++
	if r.cfg.WatchList && !r.noWList {
		rv, err := r.consume(ctx, listOptions{sendInitialEvents: true, resourceVersionMatch: "NotOlderThan", allowBookmarks: true, timeoutSeconds: watchTimeout(r.cfg)}, "", true)
		if err != nil && (isBadRequest(err) || isInvalid(err) || isWatchListRefusal(err)) && rv == "" && !r.synced.Load() {
			r.log.Info("watch-list refused by the API server; falling back to paginated LIST", "resource", r.res.String(), "err", err)
			r.noWList = true
			return "", nil
		}
		return rv, err
	}
	opts := listOptions{limit: r.cfg.ListPageSize}
	var listRV string
	for {
		lm, err := r.client.list(ctx, r.res, opts, &r.buf, func(raw []byte) error {
			r.apply(watchAdded, raw, true)
			return nil
		})
		if err != nil {
			if isExpired(err) && opts.continueToken != "" {
				opts.continueToken = "" // the continue token expired: start over
				r.gen++
				continue
			}
			return "", err
		}
		if listRV == "" {
			listRV = lm.ResourceVersion
		}
		if lm.Continue == "" {
			break
		}
		opts.continueToken = lm.Continue
	}
	r.buf = bytes.Buffer{} // a listing's body can be large: do not keep it
	r.endListing()
	return listRV, nil
}

func (r *reflector) endListing() {
	for _, c := range r.store.stale(r.gen) {
		r.h.deleted(c)
	}
	r.synced.Store(true)
}

func (r *reflector) watch(ctx context.Context, rv string) (string, error) {
	return r.consume(ctx, listOptions{resourceVersion: rv, allowBookmarks: true, timeoutSeconds: watchTimeout(r.cfg)}, rv, false)
}

// consume reads one watch. In listing mode (watch-list) the objects before
// the initial-events-end bookmark form the listing; if the stream ends
// before it, "" is returned so the listing starts again.
func (r *reflector) consume(ctx context.Context, opts listOptions, rv string, listing bool) (string, error) {
	s, err := r.client.watch(ctx, r.res, opts)
	if err != nil {
		if listing {
			return "", err
		}
		return rv, err
	}
	defer s.close()
	stop := context.AfterFunc(ctx, s.close)
	defer stop()
	for {
		typ, obj, err := s.next()
		if err != nil {
			if ctx.Err() != nil {
				return rv, ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				if listing {
					return "", errors.New("watch-list of " + r.res.String() + " ended before its initial events did")
				}
				return rv, nil
			}
			if listing {
				return "", err
			}
			return rv, err
		}
		switch typ {
		case watchBookmark:
			brv, end, err := s.bookmarkInfo(obj)
			if err != nil {
				r.decodeFailed(err)
				continue
			}
			if listing && end {
				listing = false
				r.endListing()
			}
			if !listing {
				rv = brv
			}
		case watchAdded, watchModified, watchDeleted:
			if nrv := r.apply(typ, obj, listing); nrv != "" && !listing {
				rv = nrv
			}
		}
	}
}

// apply decodes one object and updates the store; it returns the object's
// resourceVersion ("" when it could not be decoded).
func (r *reflector) apply(typ string, raw []byte, listing bool) string {
	c, err := r.decode(raw)
	if err != nil {
		r.decodeFailed(err)
		return ""
	}
	m := c.meta()
	k := objKey{m.Namespace, m.Name}
	if typ == watchDeleted {
		if _, ok := r.store.remove(k, m.UID); ok {
			r.h.deleted(c)
		}
		return m.ResourceVersion
	}
	if listing && r.store.touch(k, m.ResourceVersion, r.gen) {
		return m.ResourceVersion // relisted unchanged
	}
	if old := r.store.put(c, r.gen); old != nil {
		switch om := old.meta(); {
		case om.UID != "" && m.UID != "" && om.UID != m.UID:
			// Another object under the same name: the old one was deleted
			// and its deletion not seen (a relisting after the watch was
			// down, client-go's DeletedFinalStateUnknown). Its last known
			// state is the final one we have.
			r.h.deleted(old)
			r.h.added(c)
		case om.ResourceVersion != m.ResourceVersion:
			r.h.updated(old, c)
		}
	} else {
		r.h.added(c)
	}
	return m.ResourceVersion
}

func (r *reflector) decodeFailed(err error) {
	r.m.skipped.WithLabelValues("bad_object").Inc()
	r.log.Warn("cache notification could not be decoded; skipped", "resource", r.res.String(), "err", err)
}

// watchTimeout asks the server to end a watch after a random time in
// [MinWatchTimeout, 2*MinWatchTimeout), as client-go's reflector does.
func watchTimeout(cfg WatchConfig) int64 {
	return int64((cfg.MinWatchTimeout + time.Duration(rand.Int64N(int64(cfg.MinWatchTimeout)))).Seconds())
}
