package faultnet

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every line back.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}

func TestModes(t *testing.T) {
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "one", 5*time.Second); err != nil || got != "one\n" {
		t.Fatalf("pass: %q, %v", got, err)
	}

	// Black hole: the connection stays open and nothing comes back.
	p.SetMode(Blackhole)
	_, err = roundTrip(c, "two", 300*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("blackhole on an open connection: want a timeout, got %v", err)
	}
	// A new connection is accepted and held too.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("blackhole: dial: %v", err)
	}
	_, err = roundTrip(c2, "three", 300*time.Millisecond)
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("blackhole on a new connection: want a timeout, got %v", err)
	}
	if p.DroppedBytes() == 0 {
		t.Fatal("blackhole dropped no bytes")
	}

	// Back to pass: the black-holed connections are closed, new ones work.
	p.SetMode(Pass)
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil {
		t.Fatal("a black-holed connection survived the switch back to pass")
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, "four", 5*time.Second); err != nil || got != "four\n" {
		t.Fatalf("pass again: %q, %v", got, err)
	}

	// Reset: the open connection gets a RST, new ones too.
	p.SetMode(Reset)
	c3.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c3.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("reset: open connection read: %v", err)
	}
	c4, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_, err = roundTrip(c4, "five", 5*time.Second)
		c4.Close()
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("reset: a new connection was served or hung: %v", err)
	}
	c2.Close()
}
