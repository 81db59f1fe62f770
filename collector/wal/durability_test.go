package wal

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A torn tail cannot hold an acknowledged record: Append answers only after
// the fsync of the whole round, and a round starts writing only after the
// previous round's fsync. The test "pulls the plug" while concurrent
// appenders are writing, at an fsync: from then on every write and fsync
// fails, and
// every byte written after a file's last successful fsync is mangled the
// way a power cut can leave it (cut, zeroed pages, later pages kept). The
// log must then open without reporting acknowledged data loss, even with
// the highest acknowledged offset given as evidence, and every acknowledged
// record must be there, intact, at its offset.
func TestPowerCutDuringWritesKeepsEveryAcknowledgedRecord(t *testing.T) {
	for iter, attempt := 0, 0; iter < 12; attempt++ {
		if attempt > 100 {
			t.Fatalf("after %d attempts only %d had acknowledged records and writes in flight at the cut", attempt, iter)
		}
		rng := rand.New(rand.NewPCG(uint64(attempt), 7))
		dir := t.TempDir()
		fs := &faultFS{}
		w, err := Open(dir, Options{FS: fs, SegmentBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			acked = map[uint64][]byte{}
			wg    sync.WaitGroup
			stop  atomic.Bool
			n     atomic.Int64
		)
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					recs := make([][]byte, 1+(i+g)%20)
					for k := range recs {
						recs[k] = bytes.Repeat([]byte{byte('a' + g)}, 20+int(n.Add(1)%300))
					}
					first, _, err := w.Append(recs)
					if err != nil {
						return // the plug was pulled
					}
					mu.Lock()
					for k, r := range recs {
						acked[first+uint64(k)] = r
					}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
		// The plug is pulled at the next fsync: the write before it went
		// through, unsynced.
		fs.set(func(f *faultFS) { f.crashSync = true })
		stop.Store(true)
		wg.Wait()
		w.Close()

		// The power cut: mangle what was not fsynced.
		var mangled int64
		fs.mu.Lock()
		durable := fs.durable
		fs.mu.Unlock()
		m, _ := os.ReadDir(dir)
		for _, e := range m {
			p := dir + "/" + e.Name()
			b, _ := os.ReadFile(p)
			d := durable[p]
			if int64(len(b)) <= d {
				continue
			}
			tail := b[d:]
			switch rng.IntN(3) {
			case 0: // cut anywhere in the unsynced part
				tail = tail[:rng.IntN(len(tail)+1)]
			case 1: // zero a page-sized hole, keep what follows
				at := rng.IntN(len(tail))
				for k := at; k < min(len(tail), at+4096); k++ {
					tail[k] = 0
				}
			case 2: // flip bytes here and there
				for range 1 + rng.IntN(5) {
					tail[rng.IntN(len(tail))] ^= 0x5a
				}
			}
			mangled += int64(len(b)) - d
			if err := os.WriteFile(p, append(b[:d], tail...), 0o640); err != nil {
				t.Fatal(err)
			}
		}
		var hi uint64
		for o := range acked {
			hi = max(hi, o)
		}
		w2, err := Open(dir, Options{AckedThrough: hi, Registerer: prometheus.NewRegistry()})
		if errors.Is(err, ErrDataLoss) {
			t.Fatalf("iteration %d: a power cut during a write was reported as acknowledged data loss: %v", iter, err)
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := w2.Read(1, 1<<30)
		if err != nil {
			w2.Close()
			t.Fatalf("iteration %d: read: %v", iter, err)
		}
		have := map[uint64][]byte{}
		for _, e := range got {
			have[e.Offset] = e.Data
		}
		for o, want := range acked {
			if !bytes.Equal(have[o], want) {
				w2.Close()
				t.Fatalf("iteration %d: acknowledged record %d lost or altered after a power cut", iter, o)
			}
		}
		r := w2.Repaired()
		t.Logf("iteration %d: %d acknowledged, %d unsynced bytes mangled, repair %d torn records %d bytes, next offset after %d",
			iter, len(acked), mangled, r.Records, r.Bytes, r.Through)
		w2.Close()
		// Nothing acknowledged before the cut (the first fsync outlasted
		// the sleep on a loaded machine) or nothing in flight at it: again.
		// A WAL that never acknowledges fails on the attempt bound above.
		if len(acked) > 0 && mangled > 0 {
			iter++
		}
	}
}

// The defect of issue 13: one flipped byte in the middle of a 10,000-record
// active segment truncated the log there. Now exactly that record is lost,
// the loss of acknowledged data refuses the open unless accepted, and once
// accepted it is repaired for good.
func TestFlippedByteInTenThousandRecordSegment(t *testing.T) {
	for _, where := range []struct {
		name string
		at   int // position inside record 5000's frame
	}{{"payload", frameHeaderV2 + 5}, {"length", 1}, {"checksum", 5}, {"offset", 9}} {
		t.Run(where.name, func(t *testing.T) {
			dir := t.TempDir()
			w := mustOpen(t, dir, Options{})
			appendN(t, w, 1, 10000, 100)
			if len(w.Segments()) != 1 {
				t.Fatal("want one segment")
			}
			w.Close()
			pos := int64(headerSize)
			for i := 1; i < 5000; i++ {
				pos += int64(frameHeaderV2 + len(rec(i)))
			}
			flip(t, lastSeg(t, dir), pos+int64(where.at))
			before := snapshot(t, dir)
			if _, err := Open(dir, Options{}); !errors.Is(err, ErrDataLoss) {
				t.Fatalf("open: %v, want ErrDataLoss", err)
			}
			if snapshot(t, dir) != before {
				t.Fatal("a refused open modified the log")
			}
			w2 := mustOpen(t, dir, Options{AcceptDataLoss: true, Registerer: prometheus.NewRegistry()})
			r := w2.Repaired()
			if r.LostRecords() != 1 || r.Lost[0].From != 5000 || r.Records != 0 {
				t.Fatalf("repair = %+v, want offset 5000 lost", r)
			}
			if got := counterValue(w2.m.lostRecords); got != 1 {
				t.Fatalf("data_loss_records_total = %v", got)
			}
			checkExcept(t, w2, 1, 10000, map[uint64]bool{5000: true})
			appendN(t, w2, 10001, 10, 10)
			w2.Close()
			w3 := mustOpen(t, dir, Options{})
			if r := w3.Repaired(); len(r.Lost) != 0 || r.Bytes != 0 {
				t.Fatalf("reopen after the accepted repair: %+v", r)
			}
			checkExcept(t, w3, 1, 10010, map[uint64]bool{5000: true})
		})
	}
}

// Damage inside the last write, which was never fsynced and so never
// acknowledged (a power cut can persist its pages out of order), is a torn
// write: repaired without refusing, counted as repaired, intact records
// after it kept.
func TestDamageInsideTheLastUnsyncedWriteIsATornWrite(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir, Options{})
	appendN(t, w, 1, 100, 10)
	var recs [][]byte
	for i := 101; i <= 150; i++ {
		recs = append(recs, rec(i))
	}
	if _, err := w.Write([][][]byte{recs}); err != nil { // no Sync: never acknowledged
		t.Fatal(err)
	}
	w.Close()
	pos := int64(headerSize)
	for i := 1; i < 120; i++ {
		pos += int64(frameHeaderV2 + len(rec(i)))
	}
	flip(t, lastSeg(t, dir), pos+frameHeaderV2+2)
	w2 := mustOpen(t, dir, Options{AckedThrough: 100})
	r := w2.Repaired()
	if len(r.Lost) != 0 || r.Records != 1 {
		t.Fatalf("repair = %+v, want one torn record and no loss", r)
	}
	checkExcept(t, w2, 1, 150, map[uint64]bool{120: true})
}
