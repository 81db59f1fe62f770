package gateway

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

// Interop with the HTTP/2 implementation OpenShell runs on: the gateway and
// the driver are tonic on hyper on the Rust h2 crate, while every other
// test here has grpc-go on both sides of the proxy. testenv/h2peer is a
// gRPC peer written directly on h2 (built by `make h2peer`): as the gateway
// it runs a fixed suite (HPACK churn, concurrent unary and streaming calls,
// 1.2-3 MiB messages through h2's default 64 KiB windows, trailers-only
// errors, deadlines); as the driver it echoes like gatewaytest.Driver. Each
// suite runs straight against the driver and through the proxy in each
// relay mode, and the answers must be the same byte for byte.

// h2peerBin is testenv/h2peer's binary, built with `make h2peer` when it
// is missing (as testenv/kube builds kube-apiserver and etcd): the test
// never skips, so a run without the peer cannot pass for one with it.
func h2peerBin(t *testing.T) string {
	t.Helper()
	root, err := kube.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv(kube.BinDirEnv)
	if dir == "" {
		dir = filepath.Join(root, ".bin")
	}
	p := filepath.Join(dir, "h2peer")
	h2peerBuild.Do(func() {
		if fi, err := os.Stat(p); err == nil && !h2peerStale(root, fi.ModTime()) {
			return
		}
		out, err := exec.Command("make", "-C", root, "h2peer", "BIN="+dir).CombinedOutput()
		if err != nil {
			h2peerErr = fmt.Errorf("make h2peer: %v\n%s", err, out)
		}
	})
	if h2peerErr != nil {
		t.Fatal(h2peerErr)
	}
	return p
}

// h2peerStale reports whether a source of the peer is newer than its
// binary (built at built), as make decides: a binary from before a new
// mode was added must not run the new test.
func h2peerStale(root string, built time.Time) bool {
	srcs, _ := filepath.Glob(filepath.Join(root, "testenv", "h2peer", "src", "*.rs"))
	srcs = append(srcs, filepath.Join(root, "testenv", "h2peer", "Cargo.toml"))
	for _, src := range srcs {
		if fi, err := os.Stat(src); err == nil && fi.ModTime().After(built) {
			return true
		}
	}
	return false
}

// h2peerBuild builds the peer once per test binary.
var (
	h2peerBuild sync.Once
	h2peerErr   error
)

type h2Msg struct {
	N   int    `json:"n"`
	FNV string `json:"fnv"`
	Hex string `json:"hex"`
}

// h2Result is one call of the h2peer client suite.
type h2Result struct {
	Name     string      `json:"name"`
	Method   string      `json:"method"`
	Req      []h2Msg     `json:"req"`
	Status   int         `json:"status"`
	Headers  [][2]string `json:"headers"`
	Msgs     []h2Msg     `json:"msgs"`
	Trailers [][2]string `json:"trailers"`
	Error    string      `json:"error"`
	// goaway: the errors of the attempts before the one that answered.
	Retries []string `json:"retries"`
	// hol's held calls: bytes sent, and what came back.
	Sent   int `json:"sent"`
	Result struct {
		Bytes      int    `json:"bytes"`
		GRPCStatus string `json:"grpc_status"`
		Error      string `json:"error"`
	} `json:"result"`
}

func (r h2Result) header(name string) string {
	for _, kv := range append(slices.Clone(r.Headers), r.Trailers...) {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// runH2Client runs an h2peer client (mode client: the suite; hol: see
// TestH2InteropHeldAnswers) on socket, with hyper's settings or h2's
// defaults, and returns its calls by name.
func runH2Client(t *testing.T, bin, mode, socket string, hyper bool) map[string]h2Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{mode, socket}
	if hyper {
		args = append(args, "hyper")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("h2peer client: %v\n%s", err, stderr.String())
	}
	res := map[string]h2Result{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(nil, 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		var end struct {
			Done  *int   `json:"done"`
			Conn  string `json:"conn"`
			Dials int    `json:"dials"`
		}
		if err := json.Unmarshal(line, &end); err != nil {
			t.Fatalf("h2peer client line %q: %v", line, err)
		}
		if end.Done != nil {
			done = true
			if *end.Done != len(res) {
				t.Errorf("h2peer client: %d calls reported, %d lines", *end.Done, len(res))
			}
			if end.Conn != "Ok(Ok(Ok(())))" {
				t.Errorf("h2peer client: the connection did not end cleanly: %s", end.Conn)
			}
			continue
		}
		var r h2Result
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("h2peer client line: %v", err)
		}
		res[r.Name] = r
	}
	if !done {
		t.Fatalf("h2peer client ended without its summary line; stderr:\n%s", stderr.String())
	}
	return res
}

// startH2Server runs h2peer as the driver on socket (env: its extra
// environment).
func startH2Server(t *testing.T, bin, socket string, hyper bool, env ...string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		t.Fatal(err)
	}
	args := []string{"server", socket}
	if hyper {
		args = append(args, "hyper")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("h2peer server stderr:\n%s", stderr.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "listening") {
		t.Fatalf("h2peer server did not start: %q %v", line, err)
	}
}

// syncBuffer is a strings.Builder safe for a process's writes and a read.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fnvExtend continues an FNV-1a 64 digest over b (FNV has no finalisation).
func fnvExtend(t *testing.T, digest string, b []byte) string {
	t.Helper()
	h, err := strconv.ParseUint(digest, 16, 64)
	if err != nil {
		t.Fatalf("digest %q: %v", digest, err)
	}
	for _, c := range b {
		h ^= uint64(c)
		h *= 0x100000001b3
	}
	return fmt.Sprintf("%016x", h)
}

// h2Cancelled is the suite's call that the gateway resets after two
// answers.
const h2Cancelled = "cancel-after-2"

// checkEcho checks an echoed call: one answer per request message, each
// the request with field 906 ("echo:" + method) appended, and status OK
// (for h2Cancelled: two answers, and no status).
func checkEcho(t *testing.T, r h2Result) {
	t.Helper()
	if r.Error != "" {
		t.Errorf("%s: %s", r.Name, r.Error)
		return
	}
	suffix := protowire.AppendString(protowire.AppendTag(nil, 906, protowire.BytesType), "echo:"+r.Method)
	want := len(r.Req)
	if r.Name == h2Cancelled {
		want = 2
	}
	if len(r.Msgs) != want {
		t.Errorf("%s: %d answers to %d messages, want %d", r.Name, len(r.Msgs), len(r.Req), want)
		return
	}
	for i, a := range r.Msgs {
		q := r.Req[i]
		if a.N != q.N+len(suffix) || a.FNV != fnvExtend(t, q.FNV, suffix) {
			t.Errorf("%s: answer %d is %d bytes (fnv %s), want the %d-byte request echoed", r.Name, i, a.N, a.FNV, q.N)
		}
	}
	if r.Name == h2Cancelled {
		if len(r.Trailers) != 0 || r.header("x-echo-x-call") != h2Cancelled {
			t.Errorf("%s: trailers %q, headers %q", r.Name, r.Trailers, r.Headers)
		}
		return
	}
	if got := r.header("grpc-status"); got != "0" || r.Status != 200 {
		t.Errorf("%s: HTTP %d grpc-status %q, want 200 and 0", r.Name, r.Status, got)
	}
	if want := r.Method; r.header("x-driver-method") != want {
		t.Errorf("%s: x-driver-method %q, want %q", r.Name, r.header("x-driver-method"), want)
	}
}

// sameCall compares a call through the proxy with the same call made
// straight to the driver: status, headers and trailers (as sets: HPACK
// does not keep the order of different names across re-encoding) and
// every message byte for byte. In grpc mode the gateway's peer is a
// grpc-go server, which always sends grpc-message (empty on OK); the gRPC
// spec reads an absent and an empty grpc-message alike, so that one
// addition is not a difference.
func sameCall(t *testing.T, direct, via h2Result) {
	t.Helper()
	empty := func(kv [2]string) bool { return kv == [2]string{"grpc-message", ""} }
	for _, r := range []*h2Result{&direct, &via} {
		r.Headers = slices.DeleteFunc(slices.Clone(r.Headers), empty)
		r.Trailers = slices.DeleteFunc(slices.Clone(r.Trailers), empty)
	}
	norm := func(h [][2]string) [][2]string {
		h = slices.Clone(h)
		slices.SortFunc(h, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
		return h
	}
	if via.Error != direct.Error || via.Status != direct.Status {
		t.Errorf("%s: HTTP %d error %q through the proxy, %d %q direct", via.Name, via.Status, via.Error, direct.Status, direct.Error)
	}
	if g, w := norm(via.Headers), norm(direct.Headers); !slices.Equal(g, w) {
		t.Errorf("%s: headers through the proxy\n  %q\ndirect\n  %q", via.Name, g, w)
	}
	if g, w := norm(via.Trailers), norm(direct.Trailers); !slices.Equal(g, w) {
		t.Errorf("%s: trailers through the proxy\n  %q\ndirect\n  %q", via.Name, g, w)
	}
	if !slices.Equal(via.Msgs, direct.Msgs) {
		t.Errorf("%s: %d messages through the proxy differ from the %d direct", via.Name, len(via.Msgs), len(direct.Msgs))
	}
}

// h2Drivers are the drivers the suites run against: the Go test driver,
// and h2peer with h2's defaults and with hyper's server settings.
var h2Drivers = []string{"go", "h2", "hyper"}

// startH2Driver starts driver kind in dir and returns its socket.
func startH2Driver(t *testing.T, bin, kind, dir string) string {
	t.Helper()
	sock := filepath.Join(dir, "driver", "driver.sock")
	if kind == "go" {
		d := startDriver(t, dir)
		d.Put(testSandbox(healthyID, "healthy"))
		d.Put(testSandbox(failingID, "failing"))
	} else {
		startH2Server(t, bin, sock, kind == "hyper")
	}
	return sock
}

func TestH2Interop(t *testing.T) {
	bin := h2peerBin(t)
	for _, driver := range h2Drivers {
		for _, hyper := range []bool{false, true} {
			t.Run(fmt.Sprintf("driver=%s/hyper-client=%v", driver, hyper), func(t *testing.T) {
				dir := shortDir(t)
				sock := startH2Driver(t, bin, driver, dir)
				direct := runH2Client(t, bin, "client", sock, hyper)
				// huge-header (h2 defaults only): a 20 KB header, over
				// the 16 KiB header list a hyper/tonic server takes, which
				// answers HTTP 431. The proxy answers INTERNAL (grpc-go's
				// client leg refuses to send it).
				huge := driver == "hyper" && !hyper
				if r := direct["huge-header"]; huge && r.Status != 431 {
					t.Errorf("huge-header to a hyper driver: HTTP %d, want 431", r.Status)
				}
				for _, r := range direct {
					switch {
					case huge && r.Name == "huge-header":
					case strings.HasSuffix(r.Method, "/DescribeSandboxFuture"), strings.HasSuffix(r.Method, "/Chat"):
						checkEcho(t, r)
					case r.Error != "":
						t.Errorf("%s direct: %s", r.Name, r.Error)
					}
				}
				if got := direct["stop"].header("grpc-status"); got != "9" {
					t.Errorf("stop: grpc-status %q, want 9 (FailedPrecondition)", got)
				}
				col := startCollector(t, dir, "")
				rp := startProxy(t, proxyConfig(dir, sock, col.addr))
				via := runH2Client(t, bin, "client", rp.p.cfg.Listen, hyper)
				if len(via) != len(direct) {
					t.Fatalf("%d calls through the proxy, %d direct", len(via), len(direct))
				}
				for name, d := range direct {
					if huge && name == "huge-header" {
						if r := via[name]; r.header("grpc-status") != "13" {
							t.Errorf("huge-header through the gRPC legs: HTTP %d grpc-status %q, want INTERNAL", r.Status, r.header("grpc-status"))
						}
						continue
					}
					sameCall(t, d, via[name])
				}
			})
		}
	}
}

// TestH2InteropHeldAnswers: answers the gateway does not read yet fill its
// connection window; a call that uploads beyond the driver's window and is
// answered without DATA must still complete meanwhile, because on a direct
// connection WINDOW_UPDATE and HEADERS frames are not flow-controlled.
// Then the held answers are read in full.
func TestH2InteropHeldAnswers(t *testing.T) {
	bin := h2peerBin(t)
	for _, driver := range h2Drivers {
		for _, hyper := range []bool{false, true} {
			t.Run(fmt.Sprintf("driver=%s/hyper-client=%v", driver, hyper), func(t *testing.T) {
				dir := shortDir(t)
				sock := startH2Driver(t, bin, driver, dir)
				col := startCollector(t, dir, "")
				rp := startProxy(t, proxyConfig(dir, sock, col.addr))
				for _, path := range []string{sock, rp.p.cfg.Listen} {
					res := runH2Client(t, bin, "hol", path, hyper)
					via := "direct"
					if path != sock {
						via = "through the proxy"
					}
					up := res["hol-upload"]
					if up.Error != "" || up.header("grpc-status") != "9" {
						t.Errorf("%s: the upload call: error %q grpc-status %q, want FailedPrecondition", via, up.Error, up.header("grpc-status"))
					}
					held := 0
					for name, r := range res {
						if !strings.HasPrefix(name, "hol-held-") {
							continue
						}
						held++
						if r.Result.Error != "" || r.Result.GRPCStatus != "0" || r.Result.Bytes < r.Sent {
							t.Errorf("%s: %s: %+v, want %d+ bytes and OK", via, name, r.Result, r.Sent)
						}
					}
					if held == 0 {
						t.Errorf("%s: no held calls reported", via)
					}
				}
			})
		}
	}
}

// TestH2InteropEdited: while a pull failure is active the proxy edits the
// GetSandbox and ListSandboxes answers to an h2 gateway (with h2's
// defaults, 64 KiB windows, shared with the suite's 1.5 and 3 MiB answers
// on the same connection); everything else of the suite is still
// forwarded unchanged.
func TestH2InteropEdited(t *testing.T) {
	bin := h2peerBin(t)
	for _, hyper := range []bool{false, true} {
		t.Run(fmt.Sprintf("hyper-client=%v", hyper), func(t *testing.T) { h2InteropEdited(t, bin, hyper) })
	}
}

func h2InteropEdited(t *testing.T, bin string, hyper bool) {
	drv, rp := failingSetup(t, 0)
	direct := runH2Client(t, bin, "client", drv.Path, hyper)
	via := runH2Client(t, bin, "client", rp.p.cfg.Listen, hyper)
	for name, d := range direct {
		switch name {
		case "get-failing", "list":
			continue
		}
		sameCall(t, d, via[name])
	}
	g := via["get-failing"]
	if g.Error != "" || g.header("grpc-status") != "0" || len(g.Msgs) != 1 {
		t.Fatalf("get-failing through the proxy: %+v", g)
	}
	b, err := hex.DecodeString(g.Msgs[0].Hex)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := gatewaytest.DecodeSandbox(getSandboxField(t, b))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := resp.Condition("ImagePulled"); !ok || c.Status != "False" {
		t.Errorf("get-failing through the proxy: no ImagePulled=False condition: %+v", resp)
	}
	if g.header("x-echo-x-call") != "get-failing" {
		t.Errorf("get-failing: the driver's headers did not reach the gateway: %q", g.Headers)
	}
	l := via["list"]
	if l.Error != "" || l.header("grpc-status") != "0" || len(l.Msgs) != 1 {
		t.Fatalf("list through the proxy: %+v", l)
	}
	b, err = hex.DecodeString(l.Msgs[0].Hex)
	if err != nil {
		t.Fatal(err)
	}
	sbs, err := gatewaytest.DecodeSandboxes(b)
	if err != nil {
		t.Fatal(err)
	}
	failing := 0
	for _, s := range sbs {
		if _, ok := s.Condition("ImagePulled"); ok {
			failing++
		}
	}
	if len(sbs) != 2 || failing != 1 {
		t.Errorf("list through the proxy: %d sandboxes, %d with ImagePulled, want 2 and 1", len(sbs), failing)
	}
}

// getSandboxField is field 1 (the sandbox) of a GetSandboxResponse.
func getSandboxField(t *testing.T, b []byte) []byte {
	t.Helper()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatal("bad GetSandboxResponse")
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				t.Fatal("bad GetSandboxResponse")
			}
			return v
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Fatal("bad GetSandboxResponse")
		}
		b = b[m:]
	}
	t.Fatal("GetSandboxResponse without a sandbox")
	return nil
}

// TestH2InteropDriverGoaway: a driver on h2 that shuts every connection
// down gracefully after its 7th call (GOAWAY with the last id 2^31-1 and a
// PING, then GOAWAY with the real one, then close), as a stopping tonic
// server does. The gateway (h2peer goaway: 30 calls in a row, redialling
// when told to go away) must get every answer; a call may only be refused
// before the driver took it (GOAWAY NO_ERROR, then retried), never lost
// after. In frame mode the gateway's connection follows the driver's; in
// grpc mode the proxy's client leg redials and the gateway sees nothing.
func TestH2InteropDriverGoaway(t *testing.T) {
	bin := h2peerBin(t)
	dir := shortDir(t)
	sock := filepath.Join(dir, "driver", "driver.sock")
	startH2Server(t, bin, sock, true, "H2PEER_GOAWAY_AFTER=7")
	col := startCollector(t, dir, "")
	rp := startProxy(t, proxyConfig(dir, sock, col.addr))
	for _, path := range []string{sock, rp.p.cfg.Listen} {
		res := runH2Client(t, bin, "goaway", path, true)
		if len(res) != 30 {
			t.Fatalf("%d calls reported, want 30", len(res))
		}
		retries := 0
		for _, r := range res {
			checkEcho(t, r)
			for _, e := range r.Retries {
				retries++
				if !strings.Contains(e, "not a result of an error") {
					t.Errorf("%s (%s): an attempt failed with %q, want only a GOAWAY refusal", r.Name, path, e)
				}
			}
		}
		t.Logf("%s: %d calls refused by GOAWAY and retried", path, retries)
	}
}
