package config

import (
	"net"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

func TestParseDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"7d", 7 * Day, false},
		{"1d12h", 36 * time.Hour, false},
		{"0.5d", 12 * time.Hour, false},
		{"-1d", -Day, false},
		{"168h", 168 * time.Hour, false},
		{"250ms", 250 * time.Millisecond, false},
		{"0", 0, false},
		{"d", 0, true},
		{"7dd", 0, true},
		{"1d-2h", 0, true},
		{"7days", 0, true},
		{"1.2.3d", 0, true},
		{"200000000d", 0, true},
	} {
		got, err := ParseDuration(c.in)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v, err %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		7 * Day: "7d", 90 * time.Minute: "1h30m", time.Hour: "1h", 20 * time.Second: "20s", 0: "0s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

type inner struct {
	MaxAge time.Duration `yaml:"max_age"`
	Count  int           `yaml:"count"`
}

type embedded struct {
	Grace time.Duration `yaml:"grace"`
}

type outer struct {
	Retention inner             `yaml:"retention"`
	Window    time.Duration     `yaml:"dedupe_window"`
	Ptr       *inner            `yaml:"ptr"`
	List      []inner           `yaml:"list"`
	ByName    map[string]inner  `yaml:"by_name"`
	Plain     time.Duration     // YAML key "plain"
	Skipped   time.Duration     `yaml:"-"`
	Embedded  embedded          `yaml:",inline"`
	Other     map[string]string `yaml:"other"`
}

func TestNormalizeDurationsRefusesBareNumbers(t *testing.T) {
	doc := `retention:
  max_age: 604800
  count: 5
dedupe_window: 3600
ptr: {max_age: 1.5}
list:
  - max_age: 20
  - max_age: 1h
by_name:
  a: {max_age: "7 days"}
plain: 20ns
grace: 0
other: {x: "3"}
`
	_, err := NormalizeDurations([]byte(doc), &outer{})
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"retention.max_age: 604800 is a bare number, which would be read as nanoseconds; write the unit: if 604800 seconds were meant, write 168h or 7d",
		"dedupe_window: 3600 is a bare number, which would be read as nanoseconds; write the unit: if 3600 seconds were meant, write 1h",
		"ptr.max_age: 1.5 is a bare number",
		"list[0].max_age: 20 is a bare number, which would be read as nanoseconds; write the unit: if 20 seconds were meant, write 20s",
		`by_name.a.max_age: "7 days" is not a duration`,
		"plain: 20ns is below 1ms",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "\n") + 1; n != 6 {
		t.Errorf("%d problems, want 6:\n%s", n, msg)
	}
}

func TestNormalizeDurationsRewritesDaysInPlace(t *testing.T) {
	doc := "# comment\nretention: {max_age: 7d, count: 1}\nlist:\n  - max_age: \"1d12h\"\n  - {max_age: 2d}\ndedupe_window: 1h\ngrace: 0\n"
	out, err := NormalizeDurations([]byte(doc), &outer{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(out), "\n") != strings.Count(doc, "\n") {
		t.Errorf("lines moved:\n%s", out)
	}
	var got outer
	dec := yaml.NewDecoder(strings.NewReader(string(out)))
	dec.KnownFields(true)
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if got.Retention.MaxAge != 7*Day || got.List[0].MaxAge != 36*time.Hour || got.List[1].MaxAge != 2*Day || got.Window != time.Hour || got.Embedded.Grace != 0 {
		t.Errorf("decoded %+v from\n%s", got, out)
	}
	// Nothing to rewrite: the same bytes come back.
	plain := []byte("dedupe_window: 1h\n")
	if out, err := NormalizeDurations(plain, &outer{}); err != nil || string(out) != string(plain) {
		t.Errorf("%q, %v", out, err)
	}
}

func TestAddrs(t *testing.T) {
	for _, c := range []struct {
		addr   string
		listen string // "" = accepted, else a part of the error
		dial   string
	}{
		{"127.0.0.1:7070", "", ""},
		{"0.0.0.0:7070", "", ""},
		{":7070", "", "the host is missing"},
		{"[::1]:0", "", "port 0 cannot be dialled"},
		{"[fe80::1%eth0]:80", "", ""},
		{"localhost:http", "", ""},
		{"eventpipe-collector.eventpipe.svc:7070", "", ""},
		{"_grpc.example.com:443", "", ""},
		{"127.0.0.1:99999", "port 99999 is out of range 0-65535", "port 99999 is out of range"},
		{"256.1.1.1:1", `host "256.1.1.1" is not a valid IPv4 address`, "not a valid IPv4 address"},
		{":70x", `port "70x" is neither a number (0-65535) nor a known service name`, "neither a number"},
		{"7070", "is not host:port", "is not host:port"},
		{"host:", "the port is missing", "the port is missing"},
		{"bad_host!:80", "neither an IP address nor a valid DNS name", "valid DNS name"},
		{"-bad.example:80", "valid DNS name", "valid DNS name"},
		{"[::1::2]:80", "not a valid IPv6 address", "IPv6"},
		{"", "must be set", "must be set"},
	} {
		check := func(kind string, err error, want string) {
			switch {
			case want == "" && err != nil:
				t.Errorf("%s %q: %v", kind, c.addr, err)
			case want != "" && err == nil:
				t.Errorf("%s %q accepted, want %q", kind, c.addr, want)
			case want != "" && !strings.Contains(err.Error(), want):
				t.Errorf("%s %q: %v, want %q", kind, c.addr, err, want)
			}
		}
		check("listen", ListenAddr(c.addr), c.listen)
		check("dial", DialAddr(c.addr), c.dial)
	}
}

// What ListenAddr says agrees with what a real listener does, for the
// addresses that need no name resolution.
// (ListenAddr is stricter in one way: an empty port, which net.Listen
// takes as 0, is refused as a likely typo.)
func TestListenAddrAgreesWithListener(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:70x", "[::1]:65536"} {
		checked := ListenAddr(addr)
		l, err := net.Listen("tcp", addr)
		if l != nil {
			l.Close()
		}
		if (checked == nil) != (err == nil) && !strings.HasPrefix(addr, "[::1]") {
			t.Errorf("%q: ListenAddr %v, net.Listen %v", addr, checked, err)
		}
		if strings.HasPrefix(addr, "[::1]") && checked == nil {
			t.Errorf("%q accepted", addr)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "127.3.2.1:1": true, "[::1]:1": true, "localhost:1": true,
		":1": false, "0.0.0.0:1": false, "10.0.0.1:1": false, "example.com:1": false, "garbage": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v", addr, got)
		}
	}
}

func TestIsPlaceholderToken(t *testing.T) {
	for tok, want := range map[string]bool{
		"REPLACE-WITH-A-RANDOM-TOKEN-FOR-THE-AGENT": true,
		"replace_with_token_0123456789":             true,
		"CHANGE-ME-0123456789abcdef":                true,
		"  changeme0123456789abcdef\n":              true,
		"9f2c1e7a5b3d4c6e8f0a1b2c3d4e5f60":          false,
		"agent-token-0123456789":                    false,
		"please-replace-with-nothing-0123":          false, // only a leading placeholder counts
	} {
		if got := IsPlaceholderToken(tok); got != want {
			t.Errorf("IsPlaceholderToken(%q) = %v, want %v", tok, got, want)
		}
	}
}
