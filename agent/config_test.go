package agent

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The shipped manifest carries the placeholder cluster name, and the agent
// refuses to start with it: two clusters deployed unchanged would write
// into each other's cursor at the collector.
func TestShippedPlaceholderClusterRefused(t *testing.T) {
	b, err := os.ReadFile("../deploy/agent/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var embedded string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal([]byte(doc), &cm); err == nil && cm.Kind == "ConfigMap" {
			embedded = cm.Data["agent.yaml"]
		}
	}
	cfg, err := ParseConfig([]byte(embedded))
	if err != nil {
		t.Fatalf("embedded agent.yaml: %v", err)
	}
	if cfg.Cluster != PlaceholderCluster {
		t.Fatalf("the manifest's cluster is %q; keep PlaceholderCluster (%q) in step with it", cfg.Cluster, PlaceholderCluster)
	}
	for _, name := range []string{PlaceholderCluster, "change-me", "", "  "} {
		cfg.Cluster = name
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "cluster: ") {
			t.Errorf("cluster %q accepted: %v", name, err)
		}
	}
	cfg.Cluster = "prod-eu-1"
	if err := cfg.Validate(); err != nil && strings.Contains(err.Error(), "cluster: ") {
		t.Errorf("a real cluster name refused: %v", err)
	}
}
