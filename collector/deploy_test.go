package collector

import (
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// deploy/collector/statefulset.yaml decodes strictly into the Kubernetes
// types (no misspelt field), and wires the config the collector expects.
func TestDeployManifests(t *testing.T) {
	data, err := os.ReadFile("../deploy/collector/statefulset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	if len(docs) != 3 {
		t.Fatalf("%d documents, want ServiceAccount + Service + StatefulSet", len(docs))
	}
	var sa corev1.ServiceAccount
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &sa); err != nil || sa.Kind != "ServiceAccount" {
		t.Fatalf("service account: %v (%s)", err, sa.Kind)
	}
	var svc corev1.Service
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &svc); err != nil || svc.Kind != "Service" {
		t.Fatalf("service: %v (%s)", err, svc.Kind)
	}
	var sts appsv1.StatefulSet
	if err := yaml.UnmarshalStrict([]byte(docs[2]), &sts); err != nil || sts.Kind != "StatefulSet" {
		t.Fatalf("statefulset: %v (%s)", err, sts.Kind)
	}
	if sts.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("the collector runs as %q, not its own account %q", sts.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if strings.Join(c.Args[:3], " ") != "collector --config /etc/eventpipe/collector.yaml" {
		t.Errorf("args %v", c.Args)
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes %+v %+v", c.ReadinessProbe, c.LivenessProbe)
	}
	grace := *sts.Spec.Template.Spec.TerminationGracePeriodSeconds
	cfgData, _ := os.ReadFile("../deploy/collector/collector.yaml")
	cfg, err := ParseConfig(cfgData)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPC.ShutdownGrace.Seconds() >= float64(grace) {
		t.Errorf("grpc.shutdown_grace %s must stay below terminationGracePeriodSeconds %d", cfg.GRPC.ShutdownGrace, grace)
	}
	if !strings.HasPrefix(cfg.Store.Dir, "/var/lib/eventpipe") {
		t.Errorf("store.dir %s is not on the data volume", cfg.Store.Dir)
	}
}
