package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/eventpipe/eventpipe/testenv/kube"
)

// One control plane for the package: kube-apiserver + etcd from testenv,
// with the agent's RBAC rendered from the chart (not the generated file) and
// an audit log of every request the agent's service account makes, plus the
// CRDs of testdata/crds for the monitoring and cert-manager kinds.
var (
	root     string
	cluster  *kube.Cluster
	auditLog string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	var err error
	if root, err = RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "eventpipe-check-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	tmpDir = dir
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop control plane:", err)
			code = 1
		}
	}
	return code
}

var (
	tmpDir      string
	clusterOnce sync.Once
	clusterErr  error
)

// needCluster starts the package's control plane on first use (tests that
// only render the chart do not wait for it).
func needCluster(t *testing.T) {
	t.Helper()
	clusterOnce.Do(func() { clusterErr = startCluster(tmpDir) })
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
}

func startCluster(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	rbac := filepath.Join(dir, "agent-rbac.yaml")
	docs, err := Render(ctx, root, ManifestRelease, kube.AgentNamespace, nil, nil, "templates/agent-rbac.yaml")
	if err != nil {
		return fmt.Errorf("render the chart's agent RBAC: %w", err)
	}
	var parts []string
	for _, d := range docs {
		parts = append(parts, string(d.YAML))
	}
	if err := os.WriteFile(rbac, []byte(strings.Join(parts, "---\n")), 0o644); err != nil {
		return err
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	auditLog = filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return err
	}
	start := time.Now()
	c, err := kube.StartProcess(ctx, kube.Options{
		Dir:      filepath.Join(dir, "cluster"),
		RBACFile: rbac,
		APIServerArgs: []string{
			"--audit-policy-file=" + policy,
			"--audit-log-path=" + auditLog,
			"--audit-log-format=json",
			"--audit-log-mode=blocking",
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	cluster = c
	if err := installCRDs(ctx); err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	fmt.Fprintf(os.Stderr, "control plane with audit log and CRDs ready in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// Only the agent's service account is audited, at Metadata level (verb,
// resource, namespace, response code).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["` + kube.AgentUser + `"]
  - level: None
`

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates testdata/crds/crds.json's CRDs and waits until each is
// Established.
func installCRDs(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "check", "testdata", "crds", "crds.json"))
	if err != nil {
		return err
	}
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(cluster.AdminConfig())
	if err != nil {
		return err
	}
	for _, item := range list.Items {
		obj := &unstructured.Unstructured{Object: item}
		if _, err := dc.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for _, item := range list.Items {
		name := (&unstructured.Unstructured{Object: item}).GetName()
		for {
			cur, err := dc.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(cur) {
				break
			}
			if time.Now().After(deadline) {
				return errors.Join(fmt.Errorf("crd %s not Established within a minute", name), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func established(o *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
