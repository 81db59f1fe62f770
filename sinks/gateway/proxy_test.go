package gateway

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
)

func testSandbox(id, name string) gatewaytest.Sandbox {
	return gatewaytest.Sandbox{ID: id, Name: name, Namespace: "openshell", Workspace: "repro",
		Conditions: []gatewaytest.Condition{{Type: "Ready", Status: "False", Reason: "DependenciesNotReady",
			Message:            `Pod exists with phase: Pending; init container "workspace-init" is waiting: ImagePullBackOff`,
			LastTransitionTime: "2026-12-01T10:00:00Z"}}}
}

// reqWithUnknown is a request with a field no layout defines.
func reqWithUnknown(fields ...string) []byte {
	var b []byte
	for i, f := range fields {
		b = protowire.AppendTag(b, protowire.Number(i+1), protowire.BytesType)
		b = protowire.AppendString(b, f)
	}
	b = protowire.AppendTag(b, 777, protowire.BytesType)
	return protowire.AppendString(b, "request-unknown")
}

// TestTransparentByteIdentical calls every RPC of the layout, an unknown
// RPC of the service and an RPC of an unknown service, directly and through
// the proxy (collector unreachable, no pull failure known), and requires
// identical response bytes, headers, trailers and statuses (with details),
// and the gateway's metadata (trace headers, binary values, the deadline)
// arriving at the driver.
func TestTransparentByteIdentical(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	drv.Put(testSandbox("7f7c2c8e-4a9b-4c1e-9e57-1f0b3a9d2c11", "img-missing"))
	drv.Put(testSandbox("0b5e2a7d-1c3f-4e8a-b6d9-2a4c6e8f0a13", "sup-bad"))
	rp := startProxy(t, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
	direct := dialT(t, drv.Path)
	via := dialT(t, rp.p.cfg.Listen)

	md := metadata.Pairs(
		"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate", "rojo=00f067aa0ba902b7",
		"x-openshell-request-id", "req-42",
		"x-trace-bin", string([]byte{0, 0xff, 7}))
	type call struct {
		method string
		reqs   [][]byte
		code   codes.Code
	}
	var calls []call
	for _, m := range gatewaytest.Methods {
		c := call{method: gatewaytest.Prefix + m, reqs: [][]byte{reqWithUnknown("arg-" + m)}}
		switch m {
		case "GetSandbox":
			c.reqs = [][]byte{reqWithUnknown("7f7c2c8e-4a9b-4c1e-9e57-1f0b3a9d2c11")}
		case "StopSandbox":
			c.code = codes.FailedPrecondition
		case "WatchSandboxes":
			continue // below: a stream does not end
		}
		calls = append(calls, c)
	}
	calls = append(calls,
		call{method: gatewaytest.MethodGet, reqs: [][]byte{reqWithUnknown("no-such-id")}, code: codes.NotFound},
		call{method: gatewaytest.MethodUnknown, reqs: [][]byte{reqWithUnknown("a"), reqWithUnknown("b", "c")}},
		call{method: gatewaytest.MethodUnknownSv, reqs: [][]byte{reqWithUnknown("x"), {}, reqWithUnknown("y")}},
		call{method: gatewaytest.Prefix + "CreateSandbox", reqs: nil}, // no request at all
		// Messages larger than one HTTP/2 frame (16 KiB) arrive as a chain
		// of buffers, which the proxy forwards without copying: the unary
		// path (echoed by the test driver) and the stream path.
		call{method: gatewaytest.Prefix + "CreateSandbox", reqs: [][]byte{reqWithUnknown(strings.Repeat("a", 300<<10))}},
		call{method: gatewaytest.MethodUnknown, reqs: [][]byte{reqWithUnknown(strings.Repeat("b", 100<<10)), reqWithUnknown("c", strings.Repeat("d", 40<<10))}},
		// Larger than the proxy's fixed 1 MiB stream window: both legs
		// need window updates mid-message.
		call{method: gatewaytest.Prefix + "DeleteWorkspace", reqs: [][]byte{reqWithUnknown(strings.Repeat("e", 3<<20))}},
	)
	for _, c := range calls {
		t.Run(strings.TrimPrefix(c.method, "/"), func(t *testing.T) {
			do := func(cl *gatewaytest.Client) (gatewaytest.Response, error) {
				ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 5*time.Second)
				defer cancel()
				return cl.Call(ctx, c.method, c.reqs...)
			}
			want, werr := do(direct)
			got, gerr := do(via)
			if status.Code(werr) != c.code {
				t.Fatalf("direct call: %v, want code %s", werr, c.code)
			}
			sw, sg := status.Convert(werr).Proto(), status.Convert(gerr).Proto()
			if !proto.Equal(sw, sg) {
				t.Errorf("status through the proxy %v, direct %v", sg, sw)
			}
			if c.code != codes.OK && len(sg.GetDetails()) == 0 {
				t.Errorf("status details lost: %v", sg)
			}
			if len(got.Bodies) != len(want.Bodies) {
				t.Fatalf("%d responses through the proxy, %d direct", len(got.Bodies), len(want.Bodies))
			}
			for i := range want.Bodies {
				if !bytes.Equal(got.Bodies[i], want.Bodies[i]) {
					t.Errorf("response %d differs:\nproxy  %x\ndirect %x", i, got.Bodies[i], want.Bodies[i])
				}
			}
			if c.code == codes.OK && len(want.Bodies) == 0 && len(c.reqs) > 0 {
				t.Errorf("no response at all: the test proves nothing")
			}
			compareMD(t, "header", got.Header, want.Header)
			compareMD(t, "trailer", got.Trailer, want.Trailer)
			if d := got.Header.Get("x-driver-deadline"); len(d) != 1 || d[0] != "set" {
				t.Errorf("deadline did not reach the driver")
			}
			for _, k := range []string{"traceparent", "tracestate", "x-openshell-request-id", "x-trace-bin"} {
				if g, w := got.Header.Get("x-echo-"+k), md.Get(k); len(g) != 1 || g[0] != w[0] {
					t.Errorf("metadata %s at the driver: %q, want %q", k, g, w)
				}
			}
		})
	}

	t.Run("WatchSandboxes", func(t *testing.T) {
		ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
		defer cancel()
		wd, err := direct.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wv, err := via.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.WaitWatchers(ctx, 2); err != nil {
			t.Fatal(err)
		}
		drv.Put(testSandbox("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6", "late"))
		drv.Platform("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6", gatewaytest.PlatformEvent{TimestampMS: 1, Source: "gateway", Type: "Normal", Reason: "X", Message: "not kubernetes: kept"})
		drv.Delete("9d3e1f2a-5b6c-4d7e-8f90-a1b2c3d4e5f6")
		for i := 0; i < 5; i++ {
			a, err := wd.RecvRaw()
			if err != nil {
				t.Fatal(err)
			}
			b, err := wv.RecvRaw()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Errorf("watch message %d differs:\nproxy  %x\ndirect %x", i, b, a)
			}
		}
		hd, _ := wd.Header()
		hv, _ := wv.Header()
		compareMD(t, "watch header", hv, hd)
	})
}

func compareMD(t *testing.T, what string, got, want metadata.MD) {
	t.Helper()
	if len(want) == 0 {
		t.Errorf("%s: the driver sent none: the comparison proves nothing", what)
	}
	for k, w := range want {
		g := got.Get(k)
		if strings.Join(g, "\x00") != strings.Join(w, "\x00") {
			t.Errorf("%s %s: proxy %q, direct %q", what, k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s %s: added by the proxy (%q)", what, k, got[k])
		}
	}
}

// TestOtherUIDRefused: a client running as another uid cannot use the
// proxy. With the default modes it cannot even reach the socket (0700
// directory); with the directory and socket opened up on purpose, the
// SO_PEERCRED check drops it, counted, while our own uid still passes.
func TestOtherUIDRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("this test runs as root to start a child as uid 65534 (euid %d)", os.Geteuid())
	}
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	drv := startDriver(t, dir)
	rp := startProxy(t, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
	sock := rp.p.cfg.Listen
	st, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("socket directory mode %04o, want 0700", st.Mode().Perm())
	}
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v (%v), want 0600", st.Mode().Perm(), err)
	}

	// The test binary lives in a directory uid 65534 cannot read: copy it.
	bin := filepath.Join(dir, "child.test")
	exe, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	child := func() int {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "GATEWAY_TEST_DIAL="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		t.Logf("child as uid 65534: %v: %s", err, strings.TrimSpace(string(out)))
		return cmd.ProcessState.ExitCode()
	}
	if code := child(); code != 4 {
		t.Errorf("uid 65534 with the default modes: exit %d, want 4 (socket not reachable)", code)
	}
	// Open the directory and the socket to everyone: only SO_PEERCRED is
	// left between uid 65534 and the driver.
	if err := os.Chmod(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if code := child(); code != 3 {
		t.Errorf("uid 65534 with open modes: exit %d, want 3 (connection refused by SO_PEERCRED)", code)
	}
	if n := rp.metric(t, "eventpipe_driver_proxy_peers_rejected_total"); n < 1 {
		t.Errorf("peers_rejected_total = %v, want >= 1", n)
	}
	// Our own uid still gets through.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := dialT(t, sock).Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
		t.Errorf("same uid: %v", err)
	}
}

// TestSocketDirWrongOwner: a socket directory owned by another uid is
// refused with an error that says what to do; nothing listens.
func TestSocketDirWrongOwner(t *testing.T) {
	dir := shortDir(t)
	sockDir := filepath.Join(dir, "proxy")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sockDir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cfg := proxyConfig(dir, filepath.Join(dir, "driver", "driver.sock"), "127.0.0.1:1")
	p, err := New(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = p.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "owned by uid 65534") || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("Run = %v, want a refusal naming the owner", err)
	}
	if _, serr := os.Stat(cfg.Listen); serr == nil {
		t.Errorf("a socket was created in the refused directory")
	}
}

// TestSocketDirModes: the proxy changes the mode of a socket directory
// only when it created it. A shared directory of its own uid (1777 like
// /tmp, or group-writable) is refused and keeps its mode; an existing
// private one is used as it is; a missing one is created 0700.
func TestSocketDirModes(t *testing.T) {
	cases := []struct {
		name    string
		mode    os.FileMode // 0: the directory does not exist
		refused bool
	}{
		{"missing: created 0700", 0, false},
		{"sticky world-writable like /tmp", 0o777 | os.ModeSticky, true},
		{"world-writable", 0o777, true},
		{"group-writable", 0o770, true},
		{"private 0755 kept", 0o755, false},
		{"private 0700 kept", 0o700, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := shortDir(t)
			sockDir := filepath.Join(dir, "shared")
			if c.mode != 0 {
				if err := os.Mkdir(sockDir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(sockDir, c.mode); err != nil {
					t.Fatal(err)
				}
			}
			l, err := listenUnix(filepath.Join(sockDir, "proxy.sock"))
			if l != nil {
				l.Close()
			}
			st, serr := os.Stat(sockDir)
			if serr != nil {
				t.Fatal(serr)
			}
			want := c.mode
			if want == 0 {
				want = os.ModeDir | 0o700
			} else {
				want |= os.ModeDir
			}
			if st.Mode() != want {
				t.Errorf("directory mode %v after listen, want %v (unchanged unless created)", st.Mode(), want)
			}
			switch {
			case c.refused && (err == nil || !strings.Contains(err.Error(), "shared") || !strings.Contains(err.Error(), "eventpipe-driver-proxy")):
				t.Errorf("listen = %v, want a refusal naming the shared directory and a private one to use", err)
			case !c.refused && err != nil:
				t.Errorf("listen = %v, want success", err)
			}
		})
	}
}

// TestContentTypeUnchanged: the driver gets the request content-type the
// gateway sent, on the unary path, the stream path and WatchSandboxes:
// tonic (the OpenShell gateway) sends the bare "application/grpc", which
// the proxy once turned into "application/grpc+proto".
func TestContentTypeUnchanged(t *testing.T) {
	dir := shortDir(t)
	drv := startDriver(t, dir)
	rp := startProxy(t, proxyConfig(dir, drv.Path, "127.0.0.1:1"))
	for _, sub := range []string{"", "proto"} {
		want := "application/grpc"
		if sub != "" {
			want += "+" + sub
		}
		t.Run(want, func(t *testing.T) {
			for _, path := range []string{drv.Path, rp.p.cfg.Listen} {
				c, err := gatewaytest.Dial(path, gatewaytest.WithContentSubtype(sub))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := c.Unary(ctx, gatewaytest.MethodCaps, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Call(ctx, gatewaytest.MethodUnknownSv, reqWithUnknown("x")); err != nil {
					t.Fatal(err)
				}
				wctx, wcancel := context.WithCancel(ctx)
				if _, err := c.Watch(wctx); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 5*time.Second, "the watch at the driver", func() (bool, string) {
					return len(drv.LastMetadata(gatewaytest.MethodWatch).Get("content-type")) > 0, ""
				})
				wcancel()
				for _, m := range []string{gatewaytest.MethodCaps, gatewaytest.MethodUnknownSv, gatewaytest.MethodWatch} {
					if got := drv.LastMetadata(m).Get("content-type"); len(got) != 1 || got[0] != want {
						t.Errorf("%s (%s): the driver got content-type %q, want %q", m, map[bool]string{true: "direct", false: "via the proxy"}[path == drv.Path], got, want)
					}
				}
				waitFor(t, 5*time.Second, "the watch to end at the driver", func() (bool, string) {
					return drv.Watchers() == 0, ""
				})
				// The next pass must set it again.
				drv.ClearMetadata()
			}
		})
	}
}
