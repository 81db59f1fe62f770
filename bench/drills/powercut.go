package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// drillPowerCut: a SIGKILL keeps the page cache, so a collector that
// acknowledged before its fsync (or without one) passes collector-sigkill.
// Here the binary journals every fsync of its store files
// (EVENTPIPE_DRILL_SYNC_JOURNAL, collector/store/fs_syncjournal.go); after
// each SIGKILL under load the drill cuts every segment back to its last
// synced size and removes segments never synced: what a power cut keeps
// for certain. Then every acknowledged occurrence must still be delivered.
// The file sink waits 2 s before writing, so each cut falls on
// acknowledged records no sink had delivered yet.
func drillPowerCut(ctx context.Context, e *env) ([]SinkResult, error) {
	p, err := e.newPipeline("power-cut", colOpts{fileMaxWait: "2s"})
	if err != nil {
		return nil, err
	}
	defer p.close()
	journal := filepath.Join(p.dir, "sync-journal")
	p.col.env = []string{"EVENTPIPE_DRILL_SYNC_JOURNAL=" + journal}
	if err := p.col.start(ctx); err != nil {
		return nil, err
	}
	p.startLoad(ctx, loadInterval)
	var notes []string
	var healed time.Time
	for k := 1; k <= pick(e, 2, 5); k++ {
		sleep(ctx, pick(e, 3*time.Second, 5*time.Second))
		inflight := killInFlight(p)
		cut, err := powerCut(p.o.storeDir, journal)
		if err != nil {
			return nil, fmt.Errorf("power cut %d: %w", k, err)
		}
		notes = append(notes, fmt.Sprintf("cut %d: %d batches in flight, %s", k, inflight, cut))
		if err := p.col.start(ctx); err != nil {
			return nil, fmt.Errorf("restart after power cut %d: %w", k, err)
		}
		healed = time.Now()
	}
	rs, err := p.finish(ctx, healed)
	for i := range rs {
		rs[i].Note = strings.Join(notes, ", ") + "; " + rs[i].Note
	}
	return rs, err
}

// powerCut cuts the store's segments back to what the journal says was
// fsynced and describes what it dropped.
func powerCut(storeDir, journal string) (string, error) {
	synced, err := readSyncJournal(journal)
	if err != nil {
		return "", err
	}
	segs, err := filepath.Glob(filepath.Join(storeDir, "log", "*.seg"))
	if err != nil {
		return "", err
	}
	var bytes int64
	var removed int
	for _, seg := range segs {
		abs, err := filepath.Abs(seg)
		if err != nil {
			return "", err
		}
		st, err := os.Stat(abs)
		if err != nil {
			return "", err
		}
		size, ok := synced[abs]
		switch {
		case !ok:
			// Never fsynced: after a power cut it may not exist at all.
			if err := os.Remove(abs); err != nil {
				return "", err
			}
			removed++
			bytes += st.Size()
		case st.Size() > size:
			if err := os.Truncate(abs, size); err != nil {
				return "", err
			}
			bytes += st.Size() - size
		}
	}
	return fmt.Sprintf("%d unsynced bytes dropped, %d segments never synced removed", bytes, removed), nil
}

// readSyncJournal returns, per file, the size at its last fsync.
func readSyncJournal(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		size, name, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(size, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("sync journal line %q", sc.Text())
		}
		out[name] = n
	}
	return out, sc.Err()
}
