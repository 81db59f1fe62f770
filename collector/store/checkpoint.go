package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/eventpipe/eventpipe/collector/wal"
)

// The checkpoint (every (cluster, stream) -> resourceVersion) is written to
// two slot files alternately, each write a full snapshot: truncate-free
// overwrite, fsync. A torn write fails its checksum and the other slot, one
// commit older, is used: atomic with one fsync and no rename (see FORMAT.md).

var crcTable = crc32.MakeTable(crc32.Castagnoli)

type streamKey struct{ cluster, stream string }

type checkpoint struct {
	seq        uint64
	lastOffset uint64
	cursors    map[streamKey]string
}

type checkpointer struct {
	fs    wal.FS
	dir   string
	sync  bool
	files [2]wal.File
	seq   uint64 // last written sequence
}

func slotPath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("checkpoint.%d", i)) }

// openCheckpointer loads the newest valid slot whose lastOffset is not
// beyond the log's last offset.
func openCheckpointer(fs wal.FS, dir string, doSync bool, logLast uint64) (*checkpointer, checkpoint, error) {
	c := &checkpointer{fs: fs, dir: dir, sync: doSync}
	best := checkpoint{cursors: map[streamKey]string{}}
	created := false
	for i := range 2 {
		path := slotPath(dir, i)
		f, err := fs.OpenFile(path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			f, err = fs.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
			created = true
		}
		if err != nil {
			c.close()
			return nil, best, fmt.Errorf("open checkpoint slot: %w", err)
		}
		c.files[i] = f
		if doSync {
			// Make what is readable durable (it may only be in the page
			// cache after a failed fsync) before it is trusted.
			if err := f.Sync(); err != nil {
				c.close()
				return nil, best, fmt.Errorf("sync checkpoint slot: %w", err)
			}
		}
		cp, err := readSlot(f)
		if err != nil {
			continue // torn or empty slot: the other one is the answer
		}
		if cp.lastOffset > logLast {
			// Written in parallel with a log fsync that did not complete:
			// never trust it, and clear it so that a later log reaching
			// that offset with other data cannot revive it.
			if err := c.clearSlot(f); err != nil {
				c.close()
				return nil, best, err
			}
			continue
		}
		if cp.seq > best.seq {
			best = cp
		}
	}
	if created {
		if err := fs.SyncDir(dir); err != nil {
			c.close()
			return nil, best, fmt.Errorf("sync data dir: %w", err)
		}
	}
	c.seq = best.seq
	return c, best, nil
}

func readSlot(f wal.File) (checkpoint, error) {
	cp := checkpoint{cursors: map[streamKey]string{}}
	st, err := f.Stat()
	if err != nil {
		return cp, err
	}
	if st.Size() < 8 || st.Size() > 64<<20 {
		return cp, fmt.Errorf("%w: checkpoint slot of %d bytes", errBadRecord, st.Size())
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return cp, err
	}
	n := binary.LittleEndian.Uint32(b[0:4])
	if int64(n)+8 > int64(len(b)) {
		return cp, fmt.Errorf("%w: truncated checkpoint", errBadRecord)
	}
	body := b[8 : 8+n]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[4:8]) {
		return cp, fmt.Errorf("%w: checkpoint checksum mismatch", errBadRecord)
	}
	_, kind, p, err := decodeEnvelope(body)
	if err != nil {
		return cp, err
	}
	if kind != kindCheckpoint {
		return cp, fmt.Errorf("%w: kind %d in checkpoint slot", errBadRecord, kind)
	}
	if len(p) < 20 {
		return cp, fmt.Errorf("%w: short checkpoint", errBadRecord)
	}
	cp.seq = binary.LittleEndian.Uint64(p[0:8])
	cp.lastOffset = binary.LittleEndian.Uint64(p[8:16])
	count := binary.LittleEndian.Uint32(p[16:20])
	p = p[20:]
	next := func() (string, bool) {
		l, k := binary.Uvarint(p)
		if k <= 0 || uint64(len(p)-k) < l {
			return "", false
		}
		s := string(p[k : k+int(l)])
		p = p[k+int(l):]
		return s, true
	}
	for range count {
		cl, ok1 := next()
		st, ok2 := next()
		rv, ok3 := next()
		if !ok1 || !ok2 || !ok3 {
			return cp, fmt.Errorf("%w: checkpoint entries cut short", errBadRecord)
		}
		cp.cursors[streamKey{cl, st}] = rv
	}
	return cp, nil
}

func encodeCheckpoint(cp checkpoint, now time.Time) []byte {
	keys := make([]streamKey, 0, len(cp.cursors))
	for k := range cp.cursors {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].cluster != keys[j].cluster {
			return keys[i].cluster < keys[j].cluster
		}
		return keys[i].stream < keys[j].stream
	})
	body := appendEnvelope(nil, now, kindCheckpoint)
	body = binary.LittleEndian.AppendUint64(body, cp.seq)
	body = binary.LittleEndian.AppendUint64(body, cp.lastOffset)
	body = binary.LittleEndian.AppendUint32(body, uint32(len(keys)))
	for _, k := range keys {
		for _, s := range []string{k.cluster, k.stream, cp.cursors[k]} {
			body = binary.AppendUvarint(body, uint64(len(s)))
			body = append(body, s...)
		}
	}
	out := make([]byte, 8, 8+len(body))
	binary.LittleEndian.PutUint32(out[0:4], uint32(len(body)))
	binary.LittleEndian.PutUint32(out[4:8], crc32.Checksum(body, crcTable))
	return append(out, body...)
}

// write stores cp (its seq is set here) in the older slot and fsyncs it.
func (c *checkpointer) write(cp checkpoint, now time.Time) error {
	cp.seq = c.seq + 1
	f := c.files[cp.seq%2]
	b := encodeCheckpoint(cp, now)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("seek checkpoint slot: %w", err)
	}
	n, err := f.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := f.Truncate(int64(len(b))); err != nil {
		return fmt.Errorf("truncate checkpoint slot: %w", err)
	}
	if c.sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync checkpoint: %w", err)
		}
	}
	c.seq = cp.seq
	return nil
}

func (c *checkpointer) clearSlot(f wal.File) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("clear checkpoint slot: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("clear checkpoint slot: %w", err)
	}
	return nil
}

func (c *checkpointer) close() error {
	var err error
	for i, f := range c.files {
		if f != nil {
			if cerr := f.Close(); cerr != nil && err == nil {
				err = cerr
			}
			c.files[i] = nil
		}
	}
	return err
}
