package cri

import (
	"bufio"
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// vocabPath is the runtime error vocabulary of the enrich package.
const vocabPath = "../../../enrich/testdata/pullvocab/vocab.jsonl"

type vocabLine struct {
	Runtime  string `json:"runtime"`
	Versions string `json:"versions"`
	Example  string `json:"example"`
	Category string `json:"category"`
}

func readVocab(t *testing.T) map[int]vocabLine {
	t.Helper()
	f, err := os.Open(vocabPath)
	if err != nil {
		t.Fatalf("open vocabulary: %v", err)
	}
	defer f.Close()
	out := map[int]vocabLine{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var l vocabLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("vocabulary line %d: %v", n, err)
		}
		out[n] = l
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// envelope is the kubelet's Failed message around the CRI client's error:
// the image as written, then the gRPC status unless its code was Unknown
// (k8s.io/cri-client strips that one).
var envelope = regexp.MustCompile(`^Failed to pull image "([^"]+)": (?:rpc error: code = (\w+) desc = )?`)

// TestPullErrorsAreVocabulary: every failure the runtime can be told to
// return is, word for word and with its gRPC code, the vocabulary line its
// code cites, rendered for that line's image; and the line's category is
// the cause the outcome names.
func TestPullErrorsAreVocabulary(t *testing.T) {
	vocab := readVocab(t)
	cases := []struct {
		runtime, outcome string
		line             int
		rule             ImageRule // Addr / Platform as the line names them
		category         string
	}{
		{Containerd, PullNotFound, 1, ImageRule{}, "not_found"},
		{Containerd, PullUnauthorized, 57, ImageRule{}, "unauthorized"},
		{Containerd, PullRateLimited, 56, ImageRule{}, "rate_limited"},
		{Containerd, PullTLS, 20, ImageRule{}, "tls_error"},
		{Containerd, PullDNS, 11, ImageRule{}, "registry_unreachable"},
		{Containerd, PullConnectionRefused, 13, ImageRule{}, "registry_unreachable"},
		{Containerd, PullIOTimeout, 12, ImageRule{Addr: "140.82.114.33:443"}, "registry_unreachable"},
		{Containerd, PullPlatformMismatch, 102, ImageRule{}, "platform_mismatch"},
		{CRIO, PullNotFound, 180, ImageRule{}, "not_found"},
		{CRIO, PullUnauthorized, 124, ImageRule{}, "unauthorized"},
		{CRIO, PullRateLimited, 126, ImageRule{}, "rate_limited"},
		{CRIO, PullTLS, 143, ImageRule{}, "tls_error"},
		{CRIO, PullDNS, 141, ImageRule{}, "registry_unreachable"},
		{CRIO, PullConnectionRefused, 172, ImageRule{}, "registry_unreachable"},
		{CRIO, PullIOTimeout, 142, ImageRule{Addr: "52.5.11.128:443"}, "registry_unreachable"},
		{CRIO, PullPlatformMismatch, 164, ImageRule{Platform: "linux/arm64/v8"}, "platform_mismatch"},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.runtime+"/"+tc.outcome, func(t *testing.T) {
			seen[tc.runtime+"/"+tc.outcome] = true
			l, ok := vocab[tc.line]
			if !ok {
				t.Fatalf("vocabulary has no line %d", tc.line)
			}
			if l.Runtime != tc.runtime || l.Category != tc.category {
				t.Fatalf("line %d is %s/%s, want %s/%s", tc.line, l.Runtime, l.Category, tc.runtime, tc.category)
			}
			m := envelope.FindStringSubmatch(l.Example)
			if m == nil {
				t.Fatalf("line %d: no kubelet envelope in %q", tc.line, l.Example)
			}
			wantCode, wantMsg := codes.Unknown.String(), l.Example[len(m[0]):]
			if m[2] != "" {
				wantCode = m[2]
			}
			rule := tc.rule
			rule.Pull = tc.outcome
			st, _ := status.FromError(pullError(tc.runtime, m[1], rule))
			if st.Code().String() != wantCode {
				t.Errorf("code %s, want %s", st.Code(), wantCode)
			}
			if st.Message() != wantMsg {
				t.Errorf("message\n got: %s\nwant: %s", st.Message(), wantMsg)
			}
		})
	}
	for _, rt := range []string{Containerd, CRIO} {
		for _, o := range pullOutcomes {
			if o != PullOK && !seen[rt+"/"+o] {
				t.Errorf("%s/%s has no vocabulary case", rt, o)
			}
		}
	}
}

// TestSeedWording: the seed's workload image, as the kubelet prints
// containerd 2.x's answer (the seed report's exact text).
func TestSeedWording(t *testing.T) {
	const img = "docker.io/library/busybox:0.0.0-does-not-exist"
	err := pullError(Containerd, img, ImageRule{Pull: PullNotFound})
	want := `rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
	if err.Error() != want {
		t.Fatalf("got  %s\nwant %s", err, want)
	}
}

func TestParseRef(t *testing.T) {
	cases := []struct{ in, norm, host, obj string }{
		{"busybox", "docker.io/library/busybox:latest", "registry-1.docker.io", "latest"},
		{"busybox:1.36", "docker.io/library/busybox:1.36", "registry-1.docker.io", "1.36"},
		{"acme/app:2.0", "docker.io/acme/app:2.0", "registry-1.docker.io", "2.0"},
		{"registry.example.internal:5000/team/billing", "registry.example.internal:5000/team/billing:latest", "registry.example.internal:5000", "latest"},
		{"localhost/app:1", "localhost/app:1", "localhost", "1"},
		{"ghcr.io/a/b@sha256:abc", "ghcr.io/a/b@sha256:abc", "ghcr.io", "sha256:abc"},
	}
	for _, tc := range cases {
		r, err := parseRef(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if r.normalized() != tc.norm || r.apiHost() != tc.host || r.object() != tc.obj {
			t.Errorf("%s: got %s %s %s, want %s %s %s", tc.in, r.normalized(), r.apiHost(), r.object(), tc.norm, tc.host, tc.obj)
		}
	}
	for _, bad := range []string{"", "a b", "busybox:", "x@md5:1"} {
		if _, err := parseRef(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
