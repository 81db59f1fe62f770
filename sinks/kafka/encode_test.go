package kafka

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// seedOccurrence is the seed scenario's BackOff for the workload init
// container (seeds/image-pull-diagnostics-issue.txt).
func seedOccurrence() *eventpipev1.Occurrence {
	at := timestamppb.New(time.Date(2026, 10, 29, 10, 10, 52, 0, time.UTC))
	return &eventpipev1.Occurrence{
		SchemaVersion: 1,
		EventId:       "0c6f5a7e-5d7b-4e0b-9d1b-2f0b7b3c9a11/4471",
		OccurredAt:    at,
		ObservedAt:    timestamppb.New(at.AsTime().Add(42 * time.Millisecond)),
		Cluster:       "kind-koinon-osrepro",
		Namespace:     "openshell-openshell-repro",
		Event:         &eventpipev1.EventRef{Name: "img-missing.1873a3f1c2d4e5f6", Uid: "0c6f5a7e-5d7b-4e0b-9d1b-2f0b7b3c9a11", ResourceVersion: "4471", ApiVersion: "v1"},
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: "openshell-openshell-repro", Name: "img-missing",
			Uid: "876414ec-8379-42b9-8deb-a047f4214891", FieldPath: "spec.initContainers{workspace-init}"},
		Type:               "Normal",
		Reason:             "BackOff",
		Message:            `Back-off pulling image "docker.io/library/busybox:0.0.0-does-not-exist"`,
		Count:              4,
		ReportingComponent: "kubelet",
		ReportingInstance:  "koinon-osrepro-control-plane",
		Sandbox: &eventpipev1.Sandbox{Id: "2ff21e26-1a7b-49a2-a640-14ae153f93ea", Name: "img-missing", Workspace: "repro",
			GatewayId: "openshell", CrNamespace: "openshell-openshell-repro", CrName: "img-missing"},
		Attribution: eventpipev1.AttributionOwnerChain,
		Role:        eventpipev1.RoleWorkload,
		Container:   "workspace-init",
		Image:       "docker.io/library/busybox:0.0.0-does-not-exist",
		ImageRole:   eventpipev1.ImageRoleWorkload,
		PullFailure: &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Image: "docker.io/library/busybox:0.0.0-does-not-exist",
			Disposition: eventpipev1.DispositionRetrying, Attempts: 4, FirstSeen: timestamppb.New(at.AsTime().Add(-20 * time.Second)), LastSeen: at,
			Detail: "docker.io/library/busybox:0.0.0-does-not-exist: not found", Source: eventpipev1.PullSourceEvent},
	}
}

// The documented member order (README.md).
var memberOrder = []string{"schema", "schema_version", "event_id", "occurred_at", "observed_at", "cluster", "namespace",
	"event", "involved_object", "type", "reason", "message", "message_truncated", "count", "reporting_component",
	"reporting_instance", "action", "sandbox", "attribution", "role", "container", "image", "image_role", "pull_failure", "progress", "blocker"}

func topLevelKeys(t *testing.T, b []byte) []string {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v", err)
	}
	var keys []string
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestJSONValueGoldenAndOrder(t *testing.T) {
	got := AppendJSON(nil, seedOccurrence())
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, got, "", "  "); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, got)
	}
	pretty.WriteByte('\n')
	golden := filepath.Join("testdata", "seed-value.json")
	if *update {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(pretty.Bytes(), want) {
		t.Errorf("value differs from %s:\n%s", golden, pretty.String())
	}
	if keys := topLevelKeys(t, got); strings.Join(keys, ",") != strings.Join(memberOrder, ",") {
		t.Errorf("member order %v", keys)
	}
	// Absent parts are null, not missing.
	bare := AppendJSON(nil, &eventpipev1.Occurrence{EventId: "x/1"})
	if keys := topLevelKeys(t, bare); strings.Join(keys, ",") != strings.Join(memberOrder, ",") {
		t.Errorf("bare member order %v", keys)
	}
	if !bytes.Contains(bare, []byte(`"sandbox":null`)) || !bytes.Contains(bare, []byte(`"occurred_at":null`)) {
		t.Errorf("absent parts not null: %s", bare)
	}
}

func TestKey(t *testing.T) {
	o := seedOccurrence()
	if Key(o) != sinktest.SeedSandboxID {
		t.Errorf("attributed key %q", Key(o))
	}
	o.Sandbox = nil
	if Key(o) != "openshell-openshell-repro/876414ec-8379-42b9-8deb-a047f4214891" {
		t.Errorf("unattributed key %q", Key(o))
	}
	o.InvolvedObject = nil
	if Key(o) != o.GetEventId() {
		t.Errorf("fallback key %q", Key(o))
	}
}

func TestTruncationKeepsRunesAndMarks(t *testing.T) {
	e := encoder{format: FormatJSON, source: DefaultSource, maxBytes: MinMaxMessageBytes}
	o := seedOccurrence()
	o.Message = strings.Repeat("日本\n\"", 20_000) // escaping doubles some bytes
	msg, truncated, fits, err := e.encode(o)
	if err != nil || !truncated || !fits {
		t.Fatalf("truncated=%v fits=%v err=%v", truncated, fits, err)
	}
	if n := messageSize(&msg); n > MinMaxMessageBytes {
		t.Errorf("message of %d bytes over the limit", n)
	}
	var v struct {
		Message          string `json:"message"`
		MessageTruncated bool   `json:"message_truncated"`
	}
	if err := json.Unmarshal(msg.Value, &v); err != nil || !v.MessageTruncated || !utf8.ValidString(v.Message) || !strings.HasPrefix(o.Message, v.Message) {
		t.Errorf("truncated value: %v, marked %v, %d bytes kept", err, v.MessageTruncated, len(v.Message))
	}
	if o.MessageTruncated || len(o.Message) != 20_000*len("日本\n\"") {
		t.Error("encode modified its input")
	}
	if got := string(msg.Headers[2].Value); got != "eventpipe://kind-koinon-osrepro/kubelet" {
		t.Errorf("ce_source %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	c := NewDefaultConfig()
	c.Conn.Brokers = []string{"kafka-0.kafka:9093"}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults + brokers: %v", err)
	}
	bad := Config{Topic: "bad topic", Compression: "brotli", ValueFormat: "avro",
		MaxMessageBytes: 10, WriteTimeout: 0,
		Conn: ConnConfig{Brokers: []string{"nohost"},
			TLS:  TLSConfig{CAFile: "/nonexistent/ca.pem", CertFile: "x"},
			SASL: SASLConfig{Mechanism: "GSSAPI"}},
		CreateTopic: CreateTopicConfig{Enabled: true}}
	err := bad.Validate()
	for _, want := range []string{"brokers[0]:", "topic:", "compression:", "value_format:", "max_message_bytes:", "source:",
		"write_timeout:", "client_id:", "tls.enabled:", "tls.cert_file:", "tls.ca_file:", "sasl.mechanism:", "create_topic.partitions:",
		"create_topic.replication_factor:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	s := NewDefaultConfig()
	s.Conn.Brokers = []string{"k:9092"}
	s.Conn.SASL = SASLConfig{Mechanism: MechanismSCRAMSHA512, Password: "a", PasswordFile: "b"}
	err = s.Validate()
	for _, want := range []string{"sasl.username:", "sasl.password:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	if _, err := New(bad, nil, nil); err == nil {
		t.Error("New accepted a bad config")
	}
}

// A push's arena serves the next push only when the client is done with its
// messages; after a push abandoned with its context, the messages it
// handed to the client keep their bytes.
func TestArenaReusedOnlyAfterACompletedPush(t *testing.T) {
	e := encoder{format: FormatJSON, source: DefaultSource, maxBytes: DefaultMaxMessageBytes}
	o := seedOccurrence()
	e.start(1)
	first, _, _, err := e.encode(o)
	if err != nil {
		t.Fatal(err)
	}
	want := string(first.Value)
	e.finish(1, false) // abandoned: the client may still be writing first
	e.start(1)
	other := seedOccurrence()
	other.Message = strings.Repeat("z", len(o.GetMessage()))
	if _, _, _, err := e.encode(other); err != nil {
		t.Fatal(err)
	}
	if string(first.Value) != want {
		t.Fatal("the next push overwrote the bytes of an abandoned push's message")
	}
	e.finish(1, true)
	if cap(e.spare) == 0 {
		t.Fatal("a completed push's arena is not kept for the next push")
	}
	spare := &e.spare[:1][0]
	e.start(1)
	if &e.arena[:1][0] != spare {
		t.Error("the next push did not reuse the completed push's arena")
	}
}
