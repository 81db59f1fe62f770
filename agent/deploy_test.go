package agent

import (
	"context"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// TestDeploymentManifest submits deploy/agent/deployment.yaml to the real
// kube-apiserver with dry-run (server-side validation and defaulting) and
// checks that its embedded agent.yaml parses with strict keys.
func TestDeploymentManifest(t *testing.T) {
	b, err := os.ReadFile("../deploy/agent/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	kinds := map[string]bool{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		kinds[tm.Kind] = true
		switch tm.Kind {
		case "ServiceAccount":
			var o corev1.ServiceAccount
			if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			// The namespace and service account exist already (testenv installs
			// rbac.yaml's subjects); a dry-run create of a copy validates it.
			o.Name += "-dryrun"
			if _, err := cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, dry); err != nil {
				t.Errorf("ServiceAccount: %v", err)
			}
		case "ConfigMap":
			var o corev1.ConfigMap
			if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, &o, dry); err != nil {
				t.Errorf("ConfigMap: %v", err)
			}
			cfg, err := ParseConfig([]byte(o.Data["agent.yaml"]))
			if err != nil {
				t.Errorf("embedded agent.yaml: %v", err)
			} else if cfg.Collector.Address == "" || !cfg.LeaderElection.Enabled {
				t.Errorf("embedded agent.yaml decoded to %+v", cfg)
			}
		case "Deployment":
			var o appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.AppsV1().Deployments(o.Namespace).Create(ctx, &o, dry); err != nil {
				t.Errorf("Deployment: %v", err)
			}
			if o.Spec.Template.Spec.ServiceAccountName != "eventpipe-agent" {
				t.Errorf("Deployment runs as %q, want the service account rbac.yaml binds", o.Spec.Template.Spec.ServiceAccountName)
			}
		default:
			t.Errorf("unexpected kind %q", tm.Kind)
		}
	}
	for _, k := range []string{"ServiceAccount", "ConfigMap", "Deployment"} {
		if !kinds[k] {
			t.Errorf("manifest has no %s", k)
		}
	}
}
