package file

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// written remembers the event_ids of the last lines the sink wrote, so a
// record pushed again is not appended twice. Runners repeat what they
// pushed but had not committed when the process stopped (a SIGKILL, a
// crash, or a clean stop racing a commit) and, in Kafka mode, what a
// partition's previous owner pushed before a rebalance; an event_id names
// one occurrence, and the collector stores each once, so an id already in
// the file is always such a repeat.
//
// It is a ring of ids with a set beside it: add forgets the oldest id once
// size ids are held.
type written struct {
	size int
	ring []string
	next int
	set  map[string]struct{}
}

func newWritten(size int) *written {
	return &written{size: size, set: make(map[string]struct{}, min(size, 1<<16))}
}

func (w *written) has(id string) bool { _, ok := w.set[id]; return ok }

func (w *written) add(id string) {
	if id == "" || w.has(id) {
		return
	}
	if len(w.ring) < w.size {
		w.ring = append(w.ring, id)
	} else {
		delete(w.set, w.ring[w.next])
		w.ring[w.next] = id
		w.next = (w.next + 1) % w.size
	}
	w.set[id] = struct{}{}
}

// seedWritten reads the event_ids of the last n lines kept in files
// (oldest first, the active file last) back into a new window, oldest
// first. A line without an event_id (an occurrence that had none) or that
// is not JSON is passed over: it cannot be repeated by id.
func seedWritten(files []string, n int) (*written, int, error) {
	var ids []string // newest first
	for i := len(files) - 1; i >= 0 && len(ids) < n; i-- {
		got, err := tailIDs(files[i], n-len(ids))
		if err != nil {
			return nil, 0, err
		}
		ids = append(ids, got...)
	}
	w := newWritten(n)
	for i := len(ids) - 1; i >= 0; i-- {
		w.add(ids[i])
	}
	return w, len(ids), nil
}

// tailIDs returns the event_ids of the last n complete lines of name,
// newest first. The file is read forwards once, keeping the last n ids: a
// window of 65,536 lines is a few tens of MB read at start-up.
func tailIDs(name string, n int) ([]string, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read back %s: %w", name, err)
	}
	defer f.Close()
	ring := make([]string, 0, min(n, 1<<16))
	next := 0
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: read it whole.
			rest, err2 := r.ReadBytes('\n')
			line, err = append(append([]byte(nil), line...), rest...), err2
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read back %s: %w", name, err)
		}
		if len(line) > 0 && line[len(line)-1] == '\n' { // only complete lines
			if id := lineEventID(line); id != "" {
				if len(ring) < n {
					ring = append(ring, id)
				} else {
					ring[next] = id
					next = (next + 1) % n
				}
			}
		}
		if err != nil {
			break
		}
	}
	out := make([]string, 0, len(ring))
	for i := range ring {
		out = append(out, ring[(next+len(ring)-1-i)%len(ring)])
	}
	return out, nil
}

// lineEventID is the event_id of one JSON line. The sink writes
// schema_version first and event_id second (sinks/internal/jsonenc), so the
// id is read from the line's start without decoding the rest (a tenth of
// the cost at start-up); a line of another shape, or an id with escapes,
// is decoded whole.
func lineEventID(line []byte) string {
	rest, ok := bytes.CutPrefix(line, []byte(`{`))
	if ok {
		if r, sv := bytes.CutPrefix(rest, []byte(`"schema_version":`)); sv {
			i := 0
			for i < len(r) && r[i] >= '0' && r[i] <= '9' {
				i++
			}
			rest, ok = bytes.CutPrefix(r[i:], []byte(`,`))
		}
	}
	if ok {
		rest, ok = bytes.CutPrefix(rest, []byte(`"event_id":"`))
	}
	if ok {
		if j := bytes.IndexByte(rest, '"'); j >= 0 && bytes.IndexByte(rest[:j], '\\') < 0 {
			return string(rest[:j])
		}
	}
	var v struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(line, &v) != nil {
		return ""
	}
	return v.EventID
}
