package netproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection accepted on Addr to a target address.
type Proxy struct {
	lis    net.Listener
	target string

	mu      sync.Mutex
	holed   bool
	restore chan struct{} // closed on Restore; replaced on Blackhole
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// New listens on 127.0.0.1:0 and forwards to target.
func New(target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netproxy listen: %w", err)
	}
	p := &Proxy{lis: lis, target: target, restore: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.restore)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial instead of the target.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Blackhole stops all traffic through the proxy until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holed {
		p.holed = true
		p.restore = make(chan struct{})
	}
}

// Restore lets traffic flow again, delivering what waited.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holed {
		p.holed = false
		close(p.restore)
	}
}

// CutAll closes every open connection (new ones are still accepted).
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.holed {
		p.holed = false
		close(p.restore)
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.lis.Close()
	p.wg.Wait()
	return err
}

// gate blocks while the path is black-holed; false when the proxy closed.
func (p *Proxy) gate() bool {
	p.mu.Lock()
	ch, closed := p.restore, p.closed
	p.mu.Unlock()
	if closed {
		return false
	}
	<-ch
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if !p.gate() {
		return
	}
	upstream, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return
	}
	if !p.track(upstream) {
		return
	}
	defer p.untrack(upstream)
	done := make(chan struct{}, 2)
	go func() { p.pipe(upstream, client); done <- struct{}{} }()
	go func() { p.pipe(client, upstream); done <- struct{}{} }()
	<-done
	// One direction ended: end both, so the other copy returns.
	_ = client.Close()
	_ = upstream.Close()
	<-done
}

// pipe copies src to dst in chunks, waiting at the gate before each write
// while the path is black-holed.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if !p.gate() {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
			}
			return
		}
	}
}
