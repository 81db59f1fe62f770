package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPortsAreFreeDistinctAndOutsideTheEphemeralRange(t *testing.T) {
	ports, err := Ports(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < low || p >= high {
			t.Errorf("port %d outside %d-%d", p, low, high)
		}
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d not bindable: %v", p, err)
			continue
		}
		l.Close()
	}
}

// TestPickSkipsBoundPorts: of a range where all but a few ports are bound,
// only the free ones are handed out. The range is below the one Ports picks
// from: holding ports there would fail the servers other test packages
// (four at a time under make test) are starting on ports Ports gave them
// (CI20, 2026-12-05: a hollow kubelet's "bind: address already in use" on
// a port this test, then binding 20000-21999, had taken in between).
func TestPickSkipsBoundPorts(t *testing.T) {
	const lo, hi = 19000, 19200
	free := map[int]bool{19007: true, 19050: true, 19123: true, 19199: true}
	for p := lo; p < hi; p++ {
		if free[p] {
			continue
		}
		// A port another process holds is just as bound.
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			defer l.Close()
		}
	}
	got := map[int]bool{}
	for range 200 {
		ports, err := pick(1, lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		if !free[ports[0]] {
			t.Fatalf("pick returned %d, which is bound", ports[0])
		}
		got[ports[0]] = true
	}
	if len(got) < 2 {
		t.Errorf("200 picks returned only %v of the free %v", got, free)
	}
}
