package store

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// The crash test re-executes this test binary as a writer (TestMain runs
// crashWriter when crashWriterEnv names a data dir). The writer appends
// batches for several clusters concurrently and prints one line per
// acknowledged batch; the parent SIGKILLs it mid-stream, reopens the store
// and checks that every acknowledged occurrence is there exactly once.

const (
	crashWriterEnv = "EVENTPIPE_STORE_CRASH_WRITER_DIR"
	crashClusters  = 4
	crashBatch     = 50 // occurrences per batch
	crashStep      = 40 // batch k holds ids k*40 .. k*40+49: 10 overlap the next batch (relist-like replays)
)

func crashID(cluster string, j int) string { return fmt.Sprintf("%s-%07d/1", cluster, j) }

func crashBatchOccs(cluster string, k int) []*eventpipev1.Occurrence {
	out := make([]*eventpipev1.Occurrence, crashBatch)
	for i := range out {
		j := k*crashStep + i
		o := occ(j)
		o.EventId = crashID(cluster, j)
		o.Cluster = cluster
		out[i] = o
	}
	return out
}

// crashWriter resumes each cluster from its stored cursor (as an agent
// does) and appends until killed. Output: "ACK <cluster> <batch> <lastOffset>".
func crashWriter(dir string) int {
	s, err := Open(testConfig(dir), nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 2
	}
	var out sync.Mutex
	fmt.Println("READY")
	var wg sync.WaitGroup
	for c := range crashClusters {
		cluster := fmt.Sprintf("cluster-%d", c)
		next := 0
		if rv, ok := s.ClusterCursor(cluster, "events"); ok {
			k, _ := strconv.Atoi(rv)
			next = k + 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next; ; k++ {
				res, err := s.Append(context.Background(), cluster, "events", strconv.Itoa(k), crashBatchOccs(cluster, k))
				if err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(3)
				}
				out.Lock()
				fmt.Printf("ACK %s %d %d\n", cluster, k, res.LastOffset)
				out.Unlock()
			}
		}()
	}
	wg.Wait()
	return 0
}

func TestCrashSIGKILLKeepsEveryAcknowledgedOccurrenceOnce(t *testing.T) {
	dir := t.TempDir()
	acked := map[string]int{} // cluster -> last acknowledged batch
	for c := range crashClusters {
		acked[fmt.Sprintf("cluster-%d", c)] = -1
	}
	for cycle := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashWriterEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		if !sc.Scan() || sc.Text() != "READY" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("writer did not start: %q %s", sc.Text(), stderr.String())
		}
		killAfter := 40 + cycle*25 // acknowledged batches this cycle
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 4 || f[0] != "ACK" {
				t.Fatalf("unexpected writer output %q", sc.Text())
			}
			k, _ := strconv.Atoi(f[2])
			if k <= acked[f[1]] {
				// The writer resumes after its stored cursor, which is
				// never behind an acknowledged batch.
				t.Fatalf("writer re-sent batch %d of %s after it was acknowledged", k, f[1])
			}
			acked[f[1]] = k
			if n++; n == killAfter {
				// SIGKILL in the middle of the stream: other batches are
				// being written and fsynced right now.
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
			}
		}
		werr := cmd.Wait()
		if n < killAfter {
			t.Fatalf("writer stopped after %d acks: %v\n%s", n, werr, stderr.String())
		}
		verifyCrash(t, dir, acked)
		t.Logf("cycle %d: killed after %d acks (writer printed %d), acked batches %v", cycle, killAfter, n, acked)
	}
	// Replay the batch after each cluster's last acknowledged one, as an
	// agent resuming from an older cursor would: still exactly once.
	s := mustOpen(t, testConfig(dir), options{})
	for cluster, k := range acked {
		for _, b := range []int{k, k + 1} {
			if _, err := s.Append(context.Background(), cluster, "events", strconv.Itoa(b), crashBatchOccs(cluster, b)); err != nil {
				t.Fatal(err)
			}
		}
		acked[cluster] = k + 1
	}
	s.Close()
	verifyCrash(t, dir, acked)
}

// verifyCrash reopens the store: every occurrence of every acknowledged
// batch is stored exactly once, nothing is stored twice, and each cluster's
// cursor is its last acknowledged batch, or the one after it when that was
// committed but killed before its ack was printed (then its data is there).
func verifyCrash(t *testing.T, dir string, acked map[string]int) {
	t.Helper()
	s := mustOpen(t, testConfig(dir), options{})
	defer s.Close()
	if r := s.Repaired(); r.Bytes > 0 {
		t.Logf("repaired torn tail: %+v", r)
	}
	count := map[string]int{}
	for from := uint64(1); ; {
		recs, _, err := s.Read(context.Background(), from, 5000)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			count[r.Occurrence.GetEventId()]++
		}
		from = recs[len(recs)-1].Offset + 1
	}
	for id, n := range count {
		if n != 1 {
			t.Fatalf("%s stored %d times", id, n)
		}
	}
	for cluster, k := range acked {
		for j := 0; j < k*crashStep+crashBatch && k >= 0; j++ {
			if count[crashID(cluster, j)] != 1 {
				t.Fatalf("acknowledged occurrence %s missing after SIGKILL", crashID(cluster, j))
			}
		}
		rv, ok := s.ClusterCursor(cluster, "events")
		got, _ := strconv.Atoi(rv)
		switch {
		case k < 0 && !ok:
		case ok && got == k:
		case ok && got == k+1:
			for j := (k + 1) * crashStep; j < (k+1)*crashStep+crashBatch; j++ {
				if count[crashID(cluster, j)] != 1 {
					t.Fatalf("cursor of %s is at batch %d but its occurrence %s is missing", cluster, got, crashID(cluster, j))
				}
			}
		default:
			t.Fatalf("cursor of %s = %q (ok=%v), last acknowledged batch %d", cluster, rv, ok, k)
		}
	}
}
