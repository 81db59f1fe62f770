// Package freeport picks loopback TCP ports for servers that tests start as
// child processes, where the port must be written into a config or a flag
// before the server binds it.
//
// The usual trick, listening on 127.0.0.1:0 and closing, hands out a port
// from the kernel's ephemeral range (32768-60999 by default). Until the child
// binds it, any outgoing connection on the machine may take that same port as
// its local end, and the child then fails with "address already in use"; with
// several test packages running at once this made fresh-clone runs fail now
// and then. Ports below the ephemeral range are never chosen for outgoing
// connections, so picking there leaves only the (rare) race with another
// picker of this package, which the random start makes unlikely.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// low and high bound the range ports are picked from: below Linux's default
// ephemeral range and above the well-known and most registered ports.
const (
	low  = 20000
	high = 32000
)

// Ports returns n distinct free loopback ports, each checked by binding it.
func Ports(n int) ([]int, error) { return pick(n, low, high) }

// pick returns n distinct loopback ports of [lo, hi) that it could bind.
func pick(n, lo, hi int) ([]int, error) {
	ports := make([]int, 0, n)
	seen := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("find %d free ports in %d-%d: only %d after %d tries", n, lo, hi, len(ports), tries)
		}
		p := lo + rand.IntN(hi-lo)
		if seen[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		seen[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// Addr returns one free loopback address as host:port.
func Addr() (string, error) {
	p, err := Ports(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p[0])), nil
}
