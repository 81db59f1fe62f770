// Package netproxy is a TCP proxy on loopback that a test controls, to put
// a network fault between two processes: Blackhole makes the path swallow
// traffic the way a dropped route does (nothing arrives, nothing is
// refused, connections stay open), and Restore lets it flow again.
//
// Black-holed bytes are not discarded: the proxy stops reading, so they
// wait in the kernel's socket buffers and the sender's writes stall once
// the window fills, as TCP behaves while it retransmits into a hole;
// Restore delivers them. Connections accepted during the hole are held,
// not forwarded, until Restore. CutAll ends every open connection (a reset
// after the hole, as a NAT or load balancer that forgot the flow does).
//
// A Proxy owns its goroutines; Close stops them and closes every
// connection.
package netproxy
