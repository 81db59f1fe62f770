package kafka

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eventpipe/eventpipe/api/buildinfo"
)

// TestBuildVersionInRecords: the OCSF metadata.product.version and the
// eventpipe-version header are the build's version (api/buildinfo).
// cmd/eventpipe's TestReleaseBuildReportsItsVersion runs this test in a
// binary linked with the release flags and EVENTPIPE_WANT_VERSION set to the
// version it stamped; run alone it checks against the unstamped fallback.
func TestBuildVersionInRecords(t *testing.T) {
	want := os.Getenv("EVENTPIPE_WANT_VERSION")
	if want == "" {
		want = buildinfo.Version()
	}
	for _, format := range []string{FormatJSON, FormatProtobuf, FormatOCSF} {
		e := encoder{format: format, source: DefaultSource, maxBytes: DefaultMaxMessageBytes}
		msg, _, fits, err := e.encode(seedOccurrence())
		if err != nil || !fits {
			t.Fatalf("%s: encode: fits %v, %v", format, fits, err)
		}
		if got := header(&msg, HeaderVersion); got != want {
			t.Errorf("%s: header %s %q, want %q", format, HeaderVersion, got, want)
		}
	}
	if got := OCSF(seedOccurrence()).Metadata.Product.Version; got != want {
		t.Errorf("OCSF metadata.product.version %q, want %q", got, want)
	}
}

// TestClientReportsSoftwareNameAndVersion: every connection of the sink
// tells the broker it is eventpipe at the build's version (KIP-511
// ApiVersions v3+), in the form brokers accept.
func TestClientReportsSoftwareNameAndVersion(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type sw struct{ name, version string }
	seen := make(chan sw, 16)
	c.ControlKey(int16(kmsg.ApiVersions), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ApiVersionsRequest)
		select {
		case seen <- sw{req.ClientSoftwareName, req.ClientSoftwareVersion}:
		default:
		}
		return nil, nil, false
	})
	opts, err := ConnConfig{Brokers: c.ListenAddrs(), ClientID: DefaultClientID}.Options()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-seen
	if want := (sw{"eventpipe", SoftwareVersion(buildinfo.Version())}); got != want {
		t.Errorf("client software %+v, want %+v", got, want)
	}
}

func TestSoftwareVersionIsWhatBrokersAccept(t *testing.T) {
	valid := regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$`) // Kafka's ApiVersionsRequest check
	for _, c := range []struct{ in, want string }{
		{"1.4.0", "1.4.0"},
		{"9.8.7-release-test", "9.8.7-release-test"},
		{"v0.0.0-20261204-abcdef+dirty", "v0.0.0-20261204-abcdef-dirty"},
		{"(devel)", "devel"},
		{"+++", "unknown"},
	} {
		got := SoftwareVersion(c.in)
		if got != c.want || !valid.MatchString(got) {
			t.Errorf("SoftwareVersion(%q) = %q, want %q (valid for brokers)", c.in, got, c.want)
		}
	}
}
