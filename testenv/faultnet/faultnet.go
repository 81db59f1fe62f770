package faultnet

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Mode is what the proxy does with traffic.
type Mode int32

// Modes.
const (
	Pass Mode = iota
	Blackhole
	Reset
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Proxy forwards TCP connections from Addr to a target. Create it with New,
// stop it with Close.
type Proxy struct {
	target string
	ln     net.Listener
	mode   atomic.Int32

	mu     sync.Mutex
	conns  map[*pair]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted atomic.Int64
	dropped  atomic.Int64
}

// pair is one proxied connection: the client side and the target side.
type pair struct {
	client, server net.Conn
	once           sync.Once
}

func (p *pair) close(rst bool) {
	p.once.Do(func() {
		if rst {
			resetConn(p.client)
			resetConn(p.server)
		}
		p.client.Close()
		if p.server != nil {
			p.server.Close()
		}
	})
}

// resetConn makes Close send a RST instead of a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

// New listens on a free loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultnet: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address clients dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// Accepted is how many client connections the proxy accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// DroppedBytes is how many bytes the proxy swallowed while black-holing.
func (p *Proxy) DroppedBytes() int64 { return p.dropped.Load() }

// SetMode switches the mode. Reset resets every open connection; leaving
// Blackhole closes the connections that were black-holed.
func (p *Proxy) SetMode(m Mode) {
	old := Mode(p.mode.Swap(int32(m)))
	if m == Reset || (old == Blackhole && m != Blackhole) {
		p.closeAll(m == Reset)
	}
}

func (p *Proxy) closeAll(rst bool) {
	p.mu.Lock()
	conns := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close(rst)
	}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.closeAll(false)
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		if p.Mode() == Reset {
			resetConn(c)
			c.Close()
			continue
		}
		pr := &pair{client: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns[pr] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(pr)
	}
}

func (p *Proxy) serve(pr *pair) {
	defer p.wg.Done()
	defer func() {
		pr.close(false)
		p.mu.Lock()
		delete(p.conns, pr)
		p.mu.Unlock()
	}()
	if p.Mode() == Blackhole {
		// Accept and hold: read and discard until the mode changes
		// (SetMode closes the connection) or the client gives up.
		p.swallow(pr.client)
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		resetConn(pr.client)
		return
	}
	p.mu.Lock()
	pr.server = server
	closed := p.closed
	p.mu.Unlock()
	if closed {
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, pr.client); done <- struct{}{} }()
	go func() { p.pipe(pr.client, server); done <- struct{}{} }()
	<-done
	pr.close(false)
	<-done
}

// pipe copies src to dst while the mode is Pass and discards while it is
// Blackhole; it returns when either side fails.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.Mode() == Pass {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			} else {
				p.dropped.Add(int64(n))
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) swallow(c net.Conn) {
	n, _ := io.Copy(io.Discard, c)
	p.dropped.Add(n)
}
