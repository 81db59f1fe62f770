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

func TestAddrSkipsABoundPort(t *testing.T) {
	// Hold many ports of the range; Addr must never return one of them.
	held := map[string]bool{}
	for p := low; p < low+2000; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		defer l.Close()
		held[l.Addr().String()] = true
	}
	for range 200 {
		a, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		if held[a] {
			t.Fatalf("Addr returned %s, which is bound", a)
		}
	}
}
