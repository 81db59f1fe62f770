package netproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves a line echo on loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return lis.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	return r.ReadString('\n')
}

func TestBlackholeHoldsThenDelivers(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r, "one", 5*time.Second); err != nil || got != "one\n" {
		t.Fatalf("before the hole: %q, %v", got, err)
	}
	p.Blackhole()
	if got, err := roundTrip(c, r, "two", 300*time.Millisecond); err == nil {
		t.Fatalf("black-holed path answered %q", got)
	}
	// A connection opened during the hole is held, not refused.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial during the hole: %v", err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if got, err := roundTrip(c2, r2, "three", 300*time.Millisecond); err == nil {
		t.Fatalf("new connection through the hole answered %q", got)
	}
	p.Restore()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after restore, the held bytes: %q, %v", got, err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r2.ReadString('\n'); err != nil || got != "three\n" {
		t.Fatalf("after restore, the held connection: %q, %v", got, err)
	}
	p.CutAll()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("CutAll left the connection open")
	}
}
