package check

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/eventpipe/eventpipe/agent"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/collector/store"
)

// TestSchemaFollowsConfigStructs: the config sections values.schema.json
// describes list exactly the YAML keys the binaries read (a key added to the
// collector is not refused by the chart; a key the binaries do not know is
// not offered), except the ones the chart writes itself.
func TestSchemaFollowsConfigStructs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(ChartDir(root), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	props := func(path ...string) map[string]bool {
		n := schema
		for _, p := range path {
			n = n["properties"].(map[string]any)[p].(map[string]any)
		}
		out := map[string]bool{}
		for k := range n["properties"].(map[string]any) {
			out[k] = true
		}
		return out
	}
	cases := []struct {
		name        string
		schema      map[string]bool
		typ         reflect.Type
		chartWrites []string
	}{
		{"collector.config", props("collector", "config"), reflect.TypeOf(collector.Config{}), []string{"auth", "http", "sinks", "log", "backbone"}},
		{"collector.backbone.config", props("collector", "backbone", "config"), reflect.TypeOf(backbone.Config{}),
			[]string{"brokers", "topic", "cursor_topic", "group_prefix", "create_topics", "partitions", "replication_factor", "tls", "sasl"}},
		{"collector.config.grpc", props("collector", "config", "grpc"), reflect.TypeOf(collector.GRPCConfig{}), []string{"listen", "tls"}},
		{"collector.config.store", props("collector", "config", "store"), reflect.TypeOf(store.Config{}), []string{"dir"}},
		{"collector.config.store.retention", props("collector", "config", "store", "retention"), reflect.TypeOf(store.RetentionConfig{}), nil},
		{"collector.config.follow", props("collector", "config", "follow"), reflect.TypeOf(collector.FollowConfig{}), nil},
		{"collector.config.readiness", props("collector", "config", "readiness"), reflect.TypeOf(collector.ReadinessConfig{}), nil},
		{"agent.config", props("agent", "config"), reflect.TypeOf(agent.Config{}), []string{"cluster", "collector", "leader_election", "http"}},
	}
	for _, c := range cases {
		keys := map[string]bool{}
		yamlKeys(c.typ, keys)
		for _, w := range c.chartWrites {
			if !keys[w] {
				t.Errorf("%s: the chart writes %q, which %s does not have", c.name, w, c.typ)
			}
			delete(keys, w)
		}
		var missing, extra []string
		for k := range keys {
			if !c.schema[k] {
				missing = append(missing, k)
			}
		}
		for k := range c.schema {
			if !keys[k] {
				extra = append(extra, k)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing) > 0 {
			t.Errorf("values.schema.json %s lacks %v, which %s reads", c.name, missing, c.typ)
		}
		if len(extra) > 0 {
			t.Errorf("values.schema.json %s offers %v, which %s does not read", c.name, extra, c.typ)
		}
	}
}

// yamlKeys adds the YAML keys of struct type t to keys, with those of its
// inlined fields (the Kafka connection settings stand inline in the
// backbone: section and the Kafka sink's).
func yamlKeys(t reflect.Type, keys map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		tag, opts, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		switch {
		case strings.Contains(","+opts+",", ",inline,"):
			yamlKeys(t.Field(i).Type, keys)
		case tag != "" && tag != "-":
			keys[tag] = true
		}
	}
}
