package check

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/sinks/file"
	"github.com/eventpipe/eventpipe/testenv/evbin"
)

// renderSet renders the chart with the given values files and --set values
// (release eventpipe in namespace eventpipe) and fails the test on an error.
func renderSet(t *testing.T, values []string, set ...string) []Doc {
	t.Helper()
	docs, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", values, set)
	if err != nil {
		t.Fatalf("helm template %v %v: %v", values, set, err)
	}
	return docs
}

func find(docs []Doc, kind, name string) (Doc, bool) {
	for _, d := range docs {
		if d.Kind == kind && d.Name == name {
			return d, true
		}
	}
	return Doc{}, false
}

func valuesFile(name string) string {
	return filepath.Join(root, "deploy", "check", "testdata", "values", name)
}

// TestCollectorConfigChecksum: a change the collector applies only at
// start-up rolls its pods (a new checksum/config); in log: local a change
// it reloads in place (a sink filter, an identity) does not restart the one
// replica. Issue 22: an upgrade that added a sink logged "requires restart;
// not applied" and nothing rolled.
func TestCollectorConfigChecksum(t *testing.T) {
	kafka := []string{valuesFile("kafka.yaml")}
	sum := func(t *testing.T, values []string, set ...string) string {
		t.Helper()
		w, ok := collectorWorkload(renderSet(t, values, set...))
		if !ok {
			t.Fatal("no collector workload")
		}
		s, _, _ := unstructured.NestedString(w.Object, "spec", "template", "metadata", "annotations", "checksum/config")
		if s == "" {
			t.Fatalf("%s has no checksum/config", w.ID())
		}
		return s
	}
	local := sum(t, nil)
	kafkaSum := sum(t, kafka)
	// all-on has mTLS identities; one more is a reload (the client CA is
	// already configured; the first identity adds it, a restart).
	allOn := []string{valuesFile("all-on.yaml")}
	allOnSum := sum(t, allOn)
	more := filepath.Join(t.TempDir(), "identities.yaml")
	if err := os.WriteFile(more, []byte("collector:\n  identities:\n    - {name: a.example, role: reader, workspaces: [\"*\"]}\n    - {name: b.example, role: reader, workspaces: [team-b]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		values []string
		base   string
		set    []string
		roll   bool
	}{
		{"local: a Loki sink added", nil, local, []string{"sinks.loki.enabled=true", "sinks.loki.url=http://loki:3100/loki/api/v1/push"}, true},
		{"local: store retention", nil, local, []string{"collector.config.store.retention.max_age=72h"}, true},
		{"local: the file sink's size", nil, local, []string{"sinks.file.maxFiles=9"}, true},
		{"local: the file sink's resend window", nil, local, []string{"sinks.file.resendWindow=131072"}, true},
		{"local: a sink filter (reloaded)", nil, local, []string{"sinks.file.filter.attributed_only=true"}, false},
		{"local: identities (reloaded)", append(allOn, more), allOnSum, nil, false},
		{"local: the first identity (client CA on)", nil, local, []string{"collector.identities[0].name=proxy.example", "collector.identities[0].role=reader", "collector.identities[0].workspaces={*}"}, true},
		{"kafka: a sink filter (applied at start)", kafka, kafkaSum, []string{"sinks.loki.filter.attributed_only=true"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := sum(t, c.values, c.set...)
			if rolled := got != c.base; rolled != c.roll {
				t.Errorf("--set %v: pods roll %v, want %v", c.set, rolled, c.roll)
			}
		})
	}
}

// TestPodDisruptionBudgets: a budget only where it lets a drain proceed
// one pod at a time: 2+ replicas. Issue 22: agent.replicas=1 kept
// minAvailable 1, which blocks every node drain.
func TestPodDisruptionBudgets(t *testing.T) {
	for _, c := range []struct {
		name      string
		values    []string
		set       []string
		agent     bool
		collector bool
	}{
		{"defaults: two agents, one collector", nil, nil, true, false},
		{"one agent", nil, []string{"agent.replicas=1", "agent.leaderElection.enabled=true"}, false, false},
		{"three agents", nil, []string{"agent.replicas=3"}, true, false},
		{"kafka mode: three collectors", []string{valuesFile("kafka.yaml")}, nil, true, true},
		{"kafka mode: one collector", []string{valuesFile("kafka.yaml")}, []string{"collector.replicas=1"}, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			docs := renderSet(t, c.values, c.set...)
			_, agent := find(docs, "PodDisruptionBudget", "eventpipe-agent")
			_, collector := find(docs, "PodDisruptionBudget", "eventpipe-collector")
			if agent != c.agent || collector != c.collector {
				t.Errorf("budgets: agent %v collector %v, want %v %v", agent, collector, c.agent, c.collector)
			}
		})
	}
	// minAvailable at or above replicas blocks drains as surely.
	_, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", nil, []string{"agent.replicas=2", "agent.podDisruptionBudget.minAvailable=2"})
	if err == nil || !strings.Contains(err.Error(), "blocks every node drain") {
		t.Errorf("minAvailable 2 of 2 replicas: %v, want refused", err)
	}
}

// TestManifestValuesOnlyPlaceholderRefused: the raw manifests are rendered
// without the schema (their cluster is the placeholder CHANGE-ME); the
// schema refuses them for that placeholder alone: with the cluster named,
// they pass.
func TestManifestValuesOnlyPlaceholderRefused(t *testing.T) {
	values := []string{filepath.Join(root, "deploy", "helm", "manifests-values.yaml")}
	_, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", values, nil)
	if err == nil || !strings.Contains(err.Error(), "at '/cluster'") {
		t.Fatalf("manifests' values with CHANGE-ME: %v, want the schema to refuse /cluster", err)
	}
	renderSet(t, values, "cluster=prod-eu-1", "collector.identities[0].clusters={prod-eu-1}")
	renderSet(t, append(values, filepath.Join(root, "deploy", "helm", "manifests-kafka-values.yaml")), "cluster=prod-eu-1", "collector.identities[0].clusters={prod-eu-1}")
}

// TestExtensionPoints: what platform teams add (the all-on variant, which
// kubeconform and the server-side dry-run also check) lands where it
// should: extra env, args, volumes and mounts on both containers, the
// collector's own ServiceAccount with its workload-identity annotation,
// the reader endpoint outside the cluster (LoadBalancer, Ingress, TLSRoute)
// with the exposed host in the collector's certificate.
func TestExtensionPoints(t *testing.T) {
	docs := renderSet(t, []string{valuesFile("all-on.yaml")})
	for _, c := range []struct{ workload, container, arg string }{
		{"eventpipe-agent", "agent", "json"},
		{"eventpipe-collector", "collector", "text"},
	} {
		var w Doc
		for _, d := range docs {
			if (d.Kind == "Deployment" || d.Kind == "StatefulSet") && d.Name == c.workload {
				w = d
			}
		}
		spec, ok := podSpec(w)
		if !ok {
			t.Fatalf("no pod spec for %s", c.workload)
		}
		ctr := spec.Containers[0]
		if ctr.Name != c.container {
			t.Fatalf("%s: first container %q", c.workload, ctr.Name)
		}
		if n := len(ctr.Args); n < 2 || ctr.Args[n-2] != "--log-format" || ctr.Args[n-1] != c.arg {
			t.Errorf("%s: args %q do not end with extraArgs", c.workload, ctr.Args)
		}
		if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "HTTPS_PROXY" }) ||
			!slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" }) {
			t.Errorf("%s: env %v lacks extraEnv or GOMEMLIMIT", c.workload, ctr.Env)
		}
		if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "corp-ca" && v.ConfigMap != nil }) ||
			!slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "corp-ca" && m.MountPath == "/etc/corp-ca" }) {
			t.Errorf("%s: extraVolumes/extraVolumeMounts missing", c.workload)
		}
		if psc := spec.SecurityContext; psc == nil || !slices.Equal(psc.SupplementalGroups, []int64{4000}) {
			t.Errorf("%s: podSecurityContext override lost: %+v", c.workload, psc)
		}
		if sc := ctr.SecurityContext; sc == nil || sc.SELinuxOptions == nil || sc.SELinuxOptions.Level != "s0:c123,c456" {
			t.Errorf("%s: containerSecurityContext override lost: %+v", c.workload, sc)
		}
		if c.container == "collector" {
			if spec.ServiceAccountName != "eventpipe-collector" || spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
				t.Errorf("collector: serviceAccountName %q automount %v, want its own account with the token", spec.ServiceAccountName, spec.AutomountServiceAccountToken)
			}
		}
	}
	sa, ok := find(docs, "ServiceAccount", "eventpipe-collector")
	if ann, _, _ := unstructured.NestedString(sa.Object, "metadata", "annotations", "eks.amazonaws.com/role-arn"); !ok || ann == "" {
		t.Errorf("collector ServiceAccount %v without its workload-identity annotation", ok)
	}
	svc, _ := find(docs, "Service", "eventpipe-collector")
	if typ, _, _ := unstructured.NestedString(svc.Object, "spec", "type"); typ != "LoadBalancer" {
		t.Errorf("collector Service type %q, want LoadBalancer", typ)
	}
	if r, _, _ := unstructured.NestedStringSlice(svc.Object, "spec", "loadBalancerSourceRanges"); !slices.Equal(r, []string{"203.0.113.0/24"}) {
		t.Errorf("loadBalancerSourceRanges %v", r)
	}
	ing, ok := find(docs, "Ingress", "eventpipe-collector")
	if !ok {
		t.Fatal("no Ingress")
	}
	tlsList, _, _ := unstructured.NestedSlice(ing.Object, "spec", "tls")
	if len(tlsList) != 1 || tlsList[0].(map[string]any)["secretName"] != "eventpipe-collector-tls" {
		t.Errorf("Ingress tls %v, want the collector's certificate Secret", tlsList)
	}
	rules, _, _ := unstructured.NestedSlice(ing.Object, "spec", "rules")
	if len(rules) != 1 || rules[0].(map[string]any)["host"] != "eventpipe.example.com" {
		t.Errorf("Ingress rules %v", rules)
	}
	route, ok := find(docs, "TLSRoute", "eventpipe-collector")
	if h, _, _ := unstructured.NestedStringSlice(route.Object, "spec", "hostnames"); !ok || !slices.Equal(h, []string{"eventpipe.example.com"}) {
		t.Errorf("TLSRoute %v hostnames %v", ok, h)
	}
	cert, _ := find(docs, "Certificate", "eventpipe-collector")
	if names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames"); !slices.Contains(names, "eventpipe.example.com") {
		t.Errorf("collector certificate names %v lack the exposed host", names)
	}
	np, _ := find(docs, "NetworkPolicy", "eventpipe-collector")
	if in, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress"); len(in) != 2 {
		t.Errorf("collector NetworkPolicy ingress %v: want gRPC (agent, readers) and metrics", in)
	}
}

// TestOpenShiftValues: deploy/helm/openshift-values.yaml leaves uid, gid and
// fsGroup to the platform (restricted-v2 refuses pods naming their own) and
// keeps the rest of the hardening.
func TestOpenShiftValues(t *testing.T) {
	docs := renderSet(t, []string{filepath.Join(root, "deploy", "helm", "openshift-values.yaml")}, "cluster=prod-eu-1")
	seen := 0
	for _, d := range docs {
		spec, ok := podSpec(d)
		if !ok {
			continue
		}
		seen++
		if psc := spec.SecurityContext; psc == nil || psc.RunAsUser != nil || psc.RunAsGroup != nil || psc.FSGroup != nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
			t.Errorf("%s: pod securityContext %+v, want no uid/gid/fsGroup and runAsNonRoot", d.ID(), psc)
		}
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			if sc == nil || sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("%s/%s: securityContext %+v", d.ID(), c.Name, sc)
			}
		}
	}
	if seen != 2 {
		t.Errorf("%d workloads, want the agent and the collector", seen)
	}
}

// TestImmutableFieldsDocumented: every value the chart writes into a field
// Kubernetes refuses to change (a StatefulSet's volumeClaimTemplates) says
// so in values.yaml, and the README gives the steps to change it.
func TestImmutableFieldsDocumented(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(ChartDir(root), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(ChartDir(root), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(values), "size, storageClassName and accessModes are fixed once installed") {
		t.Error("values.yaml: collector.persistence does not say its fields are fixed once installed")
	}
	section := string(readme)
	i := strings.Index(section, "## Changing the volume")
	if i < 0 {
		t.Fatal(`README.md has no "## Changing the volume" section`)
	}
	section = section[i:]
	for _, want := range []string{"persistence.size", "storageClassName", "accessModes", "kubectl -n eventpipe patch pvc data-eventpipe-collector-0", "--cascade=orphan", "helm upgrade"} {
		if !strings.Contains(section, want) {
			t.Errorf("README, Changing the volume: no %q", want)
		}
	}
}

// TestVolumeChangeProcedure runs the README's "Changing the volume" on the
// real kube-apiserver: a StatefulSet whose persistence.size changed is
// refused (what a plain `helm upgrade` meets), and after the StatefulSet is
// deleted with --cascade=orphan the new one is accepted. (Growing the claim
// needs a volume provisioner and is not run here.)
func TestVolumeChangeProcedure(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t, 3*time.Minute)
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "eventpipe-volume"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	statefulSet := func(size string) []byte {
		docs, err := Render(ctx, root, "eventpipe", ns, nil, []string{"collector.persistence.size=" + size}, "templates/collector.yaml")
		if err != nil {
			t.Fatal(err)
		}
		d, ok := find(docs, "StatefulSet", "eventpipe-collector")
		if !ok {
			t.Fatal("no collector StatefulSet")
		}
		b, err := yaml.YAMLToJSON(d.YAML)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	apply := func(body []byte) error {
		_, err := cs.AppsV1().StatefulSets(ns).Patch(ctx, "eventpipe-collector", types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: "helm", Force: ptr(true)})
		return err
	}
	if err := apply(statefulSet("10Gi")); err != nil {
		t.Fatalf("install: %v", err)
	}
	err = apply(statefulSet("20Gi"))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.volumeClaimTemplates") || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("changed persistence.size: %v, want the API server to refuse it (the trap the README warns of)", err)
	}
	orphan := metav1.DeletePropagationOrphan
	if err := cs.AppsV1().StatefulSets(ns).Delete(ctx, "eventpipe-collector", metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil {
		t.Fatalf("delete --cascade=orphan: %v", err)
	}
	// An orphaning delete leaves the "orphan" finalizer for the garbage
	// collector of kube-controller-manager, which this control plane does
	// not run: it would take the owner references off the pods (there are
	// none here: no StatefulSet controller either) and remove the
	// finalizer. The test does that last step in its place.
	sts, err := cs.AppsV1().StatefulSets(ns).Get(ctx, "eventpipe-collector", metav1.GetOptions{})
	if err != nil || sts.DeletionTimestamp == nil || !slices.Contains(sts.Finalizers, metav1.FinalizerOrphanDependents) {
		t.Fatalf("after delete --cascade=orphan: %v (%v), want deleting with the orphan finalizer", sts, err)
	}
	sts.Finalizers = nil
	if _, err := cs.AppsV1().StatefulSets(ns).Update(ctx, sts, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("finish the orphaning delete: %v", err)
	}
	waitUntil(t, time.Minute, "StatefulSet deleted", func() bool {
		_, err := cs.AppsV1().StatefulSets(ns).Get(ctx, "eventpipe-collector", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := apply(statefulSet("20Gi")); err != nil {
		t.Fatalf("the StatefulSet with the new size after the orphaning delete: %v", err)
	}
}

// TestPostRendererThroughHelm runs the command deploy/openshell/README.md
// prints, with helm itself: `--post-renderer eventpipe --post-renderer-args
// post-render --post-renderer-args --collector=...` over a chart whose
// output is the post-renderer's test manifests, with a release build of
// eventpipe (version stamped as the release does) on PATH. The gateway
// pod comes back with the proxy in the release's image and the PodMonitor
// label.
func TestPostRendererThroughHelm(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	dir := t.TempDir()
	chart, err := os.ReadFile(filepath.Join(ChartDir(root), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	version := string(m[1])
	if err := evbin.Build(ctx, root, filepath.Join(dir, "bin", "eventpipe"),
		"-ldflags", "-X github.com/eventpipe/eventpipe/api/buildinfo.version="+version); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", filepath.Join(dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	rendered, err := os.ReadFile(filepath.Join(root, "deploy", "openshell", "testdata", "rendered.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	chartDir := filepath.Join(dir, "openshell")
	if err := os.MkdirAll(filepath.Join(chartDir, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chartDir, "Chart.yaml"), []byte("apiVersion: v2\nname: openshell\nversion: 0.1.4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chartDir, "templates", "rendered.yaml"), rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := Helm(ctx, root, "template", "openshell", chartDir, "-n", "openshell",
		"--post-renderer", "eventpipe", "--post-renderer-args", "post-render",
		"--post-renderer-args", "--collector=eventpipe-collector.eventpipe.svc:7070")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := SplitDocs(out)
	if err != nil {
		t.Fatal(err)
	}
	sts, ok := find(docs, "StatefulSet", "openshell")
	if !ok {
		t.Fatal("no gateway StatefulSet in helm's output")
	}
	spec, ok := podSpec(sts)
	if !ok {
		t.Fatal("the patched StatefulSet has no strict pod spec")
	}
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "eventpipe-driver-proxy" })
	if i < 0 || spec.Containers[i].Image != "ghcr.io/eventpipe/eventpipe:"+version {
		t.Fatalf("helm's output has no proxy in the release image %s: %+v", version, spec.Containers)
	}
	if labels, _, _ := unstructured.NestedStringMap(sts.Object, "spec", "template", "metadata", "labels"); labels["eventpipe.io/driver-proxy"] != "true" {
		t.Errorf("pod labels %v", labels)
	}
}

// TestFileSinkResendWindow: sinks.file.resendWindow reaches the file sink's
// resend_window in the collector's config, the default being the sink's.
func TestFileSinkResendWindow(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want int
	}{
		{nil, file.DefaultResendWindow},
		{[]string{"sinks.file.resendWindow=131072"}, 131072},
	} {
		s, ok := configMapFile(renderSet(t, nil, c.set...), "collector.yaml")
		if !ok {
			t.Fatalf("--set %v: no collector.yaml", c.set)
		}
		cfg, err := collector.ParseConfig([]byte(s))
		if err != nil {
			t.Fatalf("--set %v: collector.yaml: %v\n%s", c.set, err, s)
		}
		var got []int
		for _, sc := range cfg.Sinks {
			if sc.File != nil {
				got = append(got, sc.File.ResendWindow)
			}
		}
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("--set %v: file sinks' resend_window %v, want [%d]", c.set, got, c.want)
		}
	}
}

// configMapFile is the file name of the first ConfigMap in docs that holds
// one (agent.yaml, collector.yaml).
func configMapFile(docs []Doc, name string) (string, bool) {
	for _, d := range docs {
		data, _ := d.Object["data"].(map[string]any)
		if s, ok := data[name].(string); ok && d.Kind == "ConfigMap" {
			return s, true
		}
	}
	return "", false
}
