// Package faultnet is a TCP proxy on loopback that a test controls, to
// break the network between two real processes on purpose.
//
// A Proxy listens on 127.0.0.1 and forwards every accepted connection to
// one target address. Its Mode decides what happens to the traffic:
//
//   - Pass: bytes flow both ways (the normal state).
//   - Blackhole: connections stay open (new ones are accepted too) but no
//     byte is forwarded in either direction, like a network partition where
//     packets are silently dropped. The bytes held back are discarded, not
//     delivered later. Peers notice only through their own timeouts or
//     keepalives.
//   - Reset: every open connection is closed with a TCP RST (SO_LINGER 0)
//     and new connections are reset as soon as they are accepted, like a
//     peer that is down.
//
// Switching from Blackhole back to Pass closes the connections that were
// black-holed (their byte streams have a gap, so they cannot be resumed);
// clients reconnect as they would after a real partition.
//
// The fault drills (bench/drills, results in bench/drills.md) use it to
// black-hole the agent's stream to the collector.
package faultnet
