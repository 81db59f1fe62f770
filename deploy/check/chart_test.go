package check

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/eventpipe/eventpipe/agent"
	"github.com/eventpipe/eventpipe/collector"
)

// variant is one way to install the chart.
type variant struct {
	name      string
	namespace string
	values    []string // files under testdata/values, or the manifests' values
	// placeholder: the raw manifests' values, with cluster CHANGE-ME that
	// the schema refuses until the operator names the cluster; rendered
	// without the schema (TestManifestValuesOnlyPlaceholderRefused).
	placeholder bool
}

func variants() []variant {
	v := func(f string) string { return filepath.Join(root, "deploy", "check", "testdata", "values", f) }
	return []variant{
		{name: "default", namespace: "eventpipe"},
		{name: "all-on", namespace: "eventpipe-all", values: []string{v("all-on.yaml")}},
		{name: "minimal", namespace: "eventpipe-min", values: []string{v("minimal.yaml")}},
		{name: "manifests", namespace: ManifestNamespace, values: []string{filepath.Join(root, "deploy", "helm", "manifests-values.yaml")}, placeholder: true},
		{name: "kafka", namespace: "eventpipe-kafka", values: []string{v("kafka.yaml")}},
		{name: "manifests-kafka", namespace: ManifestNamespace, values: []string{filepath.Join(root, "deploy", "helm", "manifests-values.yaml"), filepath.Join(root, "deploy", "helm", "manifests-kafka-values.yaml")}, placeholder: true},
		{name: "agent-only", namespace: "eventpipe-agent", values: []string{v("agent-only.yaml")}},
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func render(t *testing.T, v variant) []Doc {
	t.Helper()
	renderFn := Render
	if v.placeholder {
		renderFn = RenderPlaceholder
	}
	docs, err := renderFn(ctxT(t, 2*time.Minute), root, "eventpipe", v.namespace, v.values, nil)
	if err != nil {
		t.Fatalf("helm template (%s): %v", v.name, err)
	}
	return docs
}

func TestHelmLintStrict(t *testing.T) {
	for _, v := range variants() {
		args := []string{"lint", "--strict", ChartDir(root), "--namespace", v.namespace}
		if v.placeholder {
			// lint checks the values against the schema whatever the flags:
			// it sees the manifests' values with the cluster named.
			args = append(args, "--set", "cluster=prod-eu-1", "--set", "collector.identities[0].clusters={prod-eu-1}")
		}
		for _, f := range v.values {
			args = append(args, "--values", f)
		}
		out, err := Helm(ctxT(t, 2*time.Minute), root, args...)
		if err != nil {
			t.Errorf("%s: %v\n%s", v.name, err, out)
		}
	}
}

// TestRenderedObjects: what every variant renders holds what the chart
// promises (kinds, hardening of every pod and container, probes, resources,
// replicas, configs the binaries accept).
func TestRenderedObjects(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			docs := render(t, v)
			kinds := map[string]int{}
			for _, d := range docs {
				kinds[d.Kind]++
				if d.Kind != "Namespace" && !clusterScoped[d.Kind] && d.Namespace != v.namespace {
					t.Errorf("%s is in namespace %q, want %q", d.ID(), d.Namespace, v.namespace)
				}
				if spec, ok := podSpec(d); ok {
					checkPodSpec(t, d, spec)
				}
			}
			want := []string{"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ConfigMap", "Deployment", "Service"}
			if !hasCollector(v) {
				// The agent alone: its Deployment, RBAC and config.
				want = []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget"}
				if kinds["Deployment"] != 1 || kinds["StatefulSet"] != 0 || kinds["Service"] != 0 || kinds["Secret"] != 0 || kinds["Certificate"] != 0 {
					t.Errorf("agent-only kinds: %v", kinds)
				}
			} else if kafkaMode(v) {
				// The collector is a second Deployment; nothing is stateful.
				if kinds["StatefulSet"] != 0 || kinds["Deployment"] != 2 || kinds["PersistentVolumeClaim"] != 0 {
					t.Errorf("kafka mode kinds: %v", kinds)
				}
			} else {
				want = append(want, "StatefulSet")
			}
			switch v.name {
			case "default":
				want = append(want, "Role", "RoleBinding", "Secret", "Certificate", "Issuer", "NetworkPolicy", "PodDisruptionBudget")
			case "all-on":
				want = append(want, "Namespace", "Role", "RoleBinding", "Secret", "Certificate", "Issuer", "NetworkPolicy", "PodDisruptionBudget",
					"PodMonitor", "PrometheusRule", "Ingress", "TLSRoute")
				// One PodDisruptionBudget: the agent's (2 replicas); the
				// one-replica collector gets none.
				if kinds["Certificate"] != 3 || kinds["ServiceMonitor"] != 0 || kinds["PodMonitor"] != 3 || kinds["PodDisruptionBudget"] != 1 || kinds["NetworkPolicy"] != 2 || kinds["ServiceAccount"] != 2 {
					t.Errorf("all-on kinds: %v", kinds)
				}
			case "minimal":
				for _, k := range []string{"Role", "NetworkPolicy", "PodDisruptionBudget", "Certificate"} {
					if kinds[k] != 0 {
						t.Errorf("minimal renders %d %s", kinds[k], k)
					}
				}
			case "kafka":
				want = append(want, "Secret", "Certificate", "NetworkPolicy", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule")
			case "manifests", "manifests-kafka":
				if kinds["Secret"] != 0 || kinds["Certificate"] != 0 {
					t.Errorf("manifests variant generates secrets or certificates: %v", kinds)
				}
			}
			for _, k := range want {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered (kinds: %v)", k, kinds)
				}
			}
			checkConfigs(t, v, docs)
		})
	}
}

var clusterScoped = map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true, "Namespace": true, "ClusterIssuer": true}

func podSpec(d Doc) (corev1.PodSpec, bool) {
	var spec corev1.PodSpec
	if d.Kind != "Deployment" && d.Kind != "StatefulSet" {
		return spec, false
	}
	tpl, ok, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec")
	if !ok {
		return spec, false
	}
	b, _ := yaml.Marshal(tpl)
	if err := yaml.UnmarshalStrict(b, &spec); err != nil {
		return spec, false
	}
	return spec, true
}

func checkPodSpec(t *testing.T, d Doc, spec corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod securityContext %+v lacks runAsNonRoot/seccomp RuntimeDefault", d.ID(), psc)
	}
	if psc != nil && (psc.FSGroup == nil || *psc.FSGroup != 65532) {
		// Secret files are mounted 0440: readable by the fsGroup, not by "other".
		t.Errorf("%s: pod fsGroup %v, want 65532 (the image's user reads 0440 secret files through it)", d.ID(), psc.FSGroup)
	}
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("%s: no pod anti-affinity", d.ID())
	}
	containers := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range containers {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s/%s: no securityContext", d.ID(), c.Name)
			continue
		case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
			t.Errorf("%s/%s: runAsNonRoot not true", d.ID(), c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s/%s: readOnlyRootFilesystem not true", d.ID(), c.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s/%s: allowPrivilegeEscalation not false", d.ID(), c.Name)
		case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0:
			t.Errorf("%s/%s: capabilities %+v, want drop [ALL] and nothing added", d.ID(), c.Name, sc.Capabilities)
		case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
			t.Errorf("%s/%s: seccompProfile not RuntimeDefault", d.ID(), c.Name)
		}
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("%s/%s: readinessProbe is not GET /readyz", d.ID(), c.Name)
		}
		if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Errorf("%s/%s: livenessProbe is not GET /healthz", d.ID(), c.Name)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s/%s: no memory request/limit", d.ID(), c.Name)
		}
	}
}

// checkConfigs: the agent and collector configs the chart writes parse with
// strict keys and pass the binaries' own validation, with the files they
// name present (the generated tokens file decoded from the chart's Secret).
func checkConfigs(t *testing.T, v variant, docs []Doc) {
	t.Helper()
	dir := t.TempDir()
	rewrite := func(s string) string {
		s = strings.ReplaceAll(s, "/var/run/secrets/eventpipe/", dir+"/secrets/")
		return strings.ReplaceAll(s, "/var/lib/eventpipe/", dir+"/data/")
	}
	var tokens []byte
	for _, d := range docs {
		if d.Kind == "Secret" {
			data, _ := d.Object["data"].(map[string]any)
			if s, ok := data["tokens.yaml"].(string); ok {
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					t.Fatalf("tokens Secret: %v", err)
				}
				tokens = b
			}
		}
	}
	if tokens == nil {
		tokens = []byte("- {token: a-token-of-the-right-length-0123, name: agent, role: agent, clusters: [prod-eu-1]}\n")
	}
	write := func(rel string, b []byte) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"collector/token", "collector-ca/ca.crt", "client-tls/tls.crt", "client-tls/tls.key", "tls/tls.crt", "tls/tls.key", "tls/ca.crt",
		"sinks/loki/password/password", "sinks/loki/token/token", "sinks/loki/tls/ca.crt", "sinks/kafka/password/password", "sinks/kafka/tls/ca.crt",
		"backbone/password/password", "backbone/tls/ca.crt"} {
		write("secrets/"+f, []byte("placeholder\n"))
	}
	write("secrets/tokens/tokens.yaml", tokens)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, d := range docs {
		if d.Kind != "ConfigMap" {
			continue
		}
		data, _ := d.Object["data"].(map[string]any)
		if s, ok := data["agent.yaml"].(string); ok {
			seen++
			s = placeholder(t, v, s, func(b []byte) error {
				cfg, err := agent.ParseConfig(b)
				if err == nil {
					err = cfg.Validate()
				}
				return err
			})
			cfg, err := agent.ParseConfig([]byte(rewrite(s)))
			if err != nil {
				t.Errorf("agent.yaml: %v\n%s", err, s)
				continue
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("agent.yaml does not validate: %v\n%s", err, s)
			}
			if cfg.Cluster == "" || cfg.Collector.TokenFile == "" {
				t.Errorf("agent.yaml lacks cluster or token: %+v", cfg)
			}
		}
		if s, ok := data["collector.yaml"].(string); ok {
			seen++
			s = placeholder(t, v, s, func(b []byte) error {
				cfg, err := collector.ParseConfig([]byte(rewrite(string(b))))
				if err == nil {
					err = cfg.Validate()
				}
				return err
			})
			cfg, err := collector.ParseConfig([]byte(rewrite(s)))
			if err != nil {
				t.Errorf("collector.yaml: %v\n%s", err, s)
				continue
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("collector.yaml does not validate: %v\n%s", err, s)
			}
			sts, _ := collectorWorkload(docs)
			g, _, _ := unstructured.NestedFieldNoCopy(sts.Object, "spec", "template", "spec", "terminationGracePeriodSeconds")
			grace, _ := g.(float64)
			if grace == 0 || cfg.GRPC.ShutdownGrace >= time.Duration(grace)*time.Second {
				t.Errorf("grpc.shutdown_grace %s is not below terminationGracePeriodSeconds %v", cfg.GRPC.ShutdownGrace, g)
			}
			if v.name == "all-on" && len(cfg.Sinks) != 3 {
				t.Errorf("all-on: %d sinks, want file, loki, kafka", len(cfg.Sinks))
			}
			if v.name == "kafka" && (len(cfg.Sinks) != 1 || cfg.Sinks[0].Type != collector.SinkLoki) {
				t.Errorf("kafka: sinks %+v, want the Loki sink (a consumer group)", cfg.Sinks)
			}
			if kafkaMode(v) != cfg.KafkaMode() {
				t.Errorf("collector.yaml: log %q in the %s variant", cfg.Log, v.name)
			}
			if cfg.KafkaMode() && (cfg.Backbone == nil || len(cfg.Backbone.Conn.Brokers) == 0) {
				t.Errorf("collector.yaml in kafka mode has no backbone brokers:\n%s", s)
			}
		}
	}
	if want := map[bool]int{true: 2, false: 1}[hasCollector(v)]; seen != want {
		t.Errorf("found %d of the agent and collector configs, want %d", seen, want)
	}
}

// TestManifestsUpToDate: deploy/agent and deploy/collector hold exactly what
// `make manifests` renders from the chart.
func TestManifestsUpToDate(t *testing.T) {
	files, err := Manifests(ctxT(t, 2*time.Minute), root)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v (run make manifests)", p, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what the chart renders: run `make manifests` and commit the result", p)
		}
	}
}

// TestValuesSchemaRejects: wrong values fail `helm template` (and so `helm
// install`) with a message that names the value.
func TestValuesSchemaRejects(t *testing.T) {
	cases := []struct {
		name string
		set  []string
		want string // in the error
	}{
		{"replicas not a number", []string{"agent.replicas=two"}, "/agent/replicas"},
		{"collector scaled out on the local log", []string{"collector.replicas=2"}, "at '/collector/log': value must be 'kafka'"},
		{"unknown log", []string{"collector.log=disk"}, "/collector/log"},
		{"log in the collector's config instead of collector.log", []string{"collector.config.log=kafka"}, "'log' not allowed"},
		{"backbone in the collector's config instead of collector.backbone", []string{"collector.config.backbone.topic=x"}, "'backbone' not allowed"},
		{"kafka mode without brokers", []string{"collector.log=kafka", "sinks.file.enabled=false"}, "/collector/backbone/brokers"},
		{"backbone broker without port", []string{"collector.log=kafka", "sinks.file.enabled=false", "collector.backbone.brokers={kafka}"}, "/collector/backbone/brokers/0"},
		{"kafka mode with the file sink", []string{"collector.log=kafka", "collector.backbone.brokers={kafka:9092}"}, "at '/sinks/file/enabled': value must be false"},
		{"backbone topic name", []string{"collector.backbone.topic=events/all"}, "/collector/backbone/topic"},
		{"backbone dedupe window too small", []string{"collector.backbone.config.dedupe_window=10"}, "/collector/backbone/config/dedupe_window"},
		{"backbone produce timeout without unit", []string{"collector.backbone.config.produce_timeout=10"}, "/collector/backbone/config/produce_timeout"},
		{"backbone unknown key", []string{"collector.backbone.config.acks=1"}, "acks"},
		{"zero collector replicas", []string{"collector.replicas=0"}, "/collector/replicas"},
		{"duration without unit", []string{"collector.config.grpc.shutdown_grace=20"}, "/collector/config/grpc/shutdown_grace"},
		{"duration in words", []string{"collector.config.store.retention.max_age=7days"}, "/collector/config/store/retention/max_age"},
		{"unknown anti-affinity", []string{"agent.podAntiAffinity=maybe"}, "/agent/podAntiAffinity"},
		{"misspelt key", []string{"agent.replicsa=3"}, "replicsa"},
		{"empty cluster name", []string{"cluster="}, "/cluster"},
		{"bad digest", []string{"image.digest=sha256:xyz"}, "/image/digest"},
		{"bad volume size", []string{"collector.persistence.size=lots"}, "/collector/persistence/size"},
		{"two agents without leader election", []string{"agent.leaderElection.enabled=false"}, "/agent/leaderElection/enabled"},
		{"loki without url", []string{"sinks.loki.enabled=true"}, "/sinks/loki/url"},
		{"kafka without brokers", []string{"sinks.kafka.enabled=true"}, "/sinks/kafka/brokers"},
		{"kafka broker without port", []string{"sinks.kafka.enabled=true", "sinks.kafka.brokers={kafka}"}, "/sinks/kafka/brokers/0"},
		{"unknown SASL mechanism", []string{"sinks.kafka.sasl.mechanism=GSSAPI"}, "/sinks/kafka/sasl/mechanism"},
		{"TLS without a certificate source", []string{"tls.certManager.enabled=false"}, "/tls/existingSecret"},
		{"mTLS without cert-manager", []string{"tls.mutualTLS=true", "tls.certManager.enabled=false", "tls.existingSecret=x"}, "/tls/certManager/enabled"},
		{"ratio above 1", []string{"monitoring.prometheusRule.diskAvailableRatio=5"}, "/monitoring/prometheusRule/diskAvailableRatio"},
		{"bad log level", []string{"collector.logLevel=loud"}, "/collector/logLevel"},
		{"sink filter type", []string{"sinks.file.filter.types={Error}"}, "/sinks/file/filter/types/0"},
		{"file sink off the volume", []string{"sinks.file.path=/tmp/events.jsonl"}, "/sinks/file/path"},
		{"file sink resend window of 0", []string{"sinks.file.resendWindow=0"}, "/sinks/file/resendWindow"},
		{"file sink resend window above the sink's bound", []string{"sinks.file.resendWindow=4194305"}, "/sinks/file/resendWindow"},
		// The chart's traps (issue 22): each value below installed a chart
		// that failed at run time.
		{"placeholder cluster", []string{"cluster=CHANGE-ME"}, "at '/cluster': 'not' failed"},
		{"placeholder cluster of an identity", []string{"collector.identities[0].name=a", "collector.identities[0].role=agent", "collector.identities[0].clusters={CHANGE-ME}"}, "/collector/identities/0/clusters/0"},
		{"ServiceMonitor and PodMonitor together", []string{"monitoring.serviceMonitor.enabled=true", "monitoring.podMonitor.enabled=true", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus"}, "/monitoring/podMonitor/enabled"},
		{"ServiceMonitor behind closed NetworkPolicies", []string{"monitoring.serviceMonitor.enabled=true"}, "/networkPolicy/metricsFrom"},
		{"PodMonitor behind closed NetworkPolicies", []string{"monitoring.podMonitor.enabled=true"}, "/networkPolicy/metricsFrom"},
		{"root by podSecurityContext", []string{"podSecurityContext.runAsNonRoot=false"}, "/podSecurityContext/runAsNonRoot"},
		{"uid 0", []string{"containerSecurityContext.runAsUser=0"}, "/containerSecurityContext/runAsUser"},
		{"privileged container", []string{"containerSecurityContext.privileged=true"}, "/containerSecurityContext/privileged"},
		{"capability added", []string{"containerSecurityContext.capabilities.add={NET_ADMIN}"}, "/containerSecurityContext/capabilities/add"},
		{"extraEnv overriding GOMEMLIMIT", []string{"agent.extraEnv[0].name=GOMEMLIMIT", "agent.extraEnv[0].value=1GiB"}, "/agent/extraEnv/0/name"},
		{"extraVolumeMount without path", []string{"collector.extraVolumeMounts[0].name=x"}, "/collector/extraVolumeMounts/0"},
		{"ingress without hosts", []string{"collector.expose.ingress.enabled=true", "networkPolicy.enabled=false"}, "/collector/expose/hosts"},
		{"gateway without parentRefs", []string{"collector.expose.gateway.enabled=true", "collector.expose.hosts={ep.example.com}", "networkPolicy.enabled=false"}, "/collector/expose/gateway/parentRefs"},
		{"gateway passthrough without TLS", []string{"collector.expose.gateway.enabled=true", "collector.expose.hosts={ep.example.com}", "collector.expose.gateway.parentRefs[0].name=gw", "tls.enabled=false", "tls.certManager.enabled=false", "networkPolicy.enabled=false"}, "/tls/enabled"},
		{"plaintext ingress without a certificate", []string{"collector.expose.ingress.enabled=true", "collector.expose.hosts={ep.example.com}", "tls.enabled=false", "tls.certManager.enabled=false", "networkPolicy.enabled=false"}, "/collector/expose/ingress"},
		{"ingress behind closed NetworkPolicies", []string{"collector.expose.ingress.enabled=true", "collector.expose.hosts={ep.example.com}"}, "/networkPolicy/readers"},
		{"load balancer behind closed NetworkPolicies", []string{"collector.service.type=LoadBalancer"}, "/networkPolicy/readers"},
		{"bad exposed host", []string{"collector.expose.hosts={Not A Host}"}, "/collector/expose/hosts/0"},
	}
	var mu sync.Mutex
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", nil, c.set)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				t.Fatalf("--set %v rendered without error", c.set)
			}
			msg := err.Error()
			if !strings.Contains(msg, "values don't meet the specifications of the schema") || !strings.Contains(msg, c.want) {
				t.Errorf("--set %v: error does not name %q as a schema violation:\n%s", c.set, c.want, msg)
			}
		})
	}
}

// TestKubeconform validates every variant with kubeconform -strict against
// schemas generated from the test kube-apiserver's OpenAPI (with the CRDs).
func TestKubeconform(t *testing.T) {
	bin, err := Tool(root, "kubeconform")
	if err != nil {
		t.Fatal(err)
	}
	needCluster(t)
	ctx := ctxT(t, 5*time.Minute)
	var all []Doc
	outs := map[string][]Doc{}
	for _, v := range variants() {
		outs[v.name] = render(t, v)
		all = append(all, outs[v.name]...)
	}
	want := map[string]bool{}
	for _, d := range all {
		want[SchemaFileName(d.APIVersion, d.Kind)] = true
	}
	schemaDir := t.TempDir()
	// The OpenAPI document takes a moment to include new CRDs.
	var missing []string
	for deadline := time.Now().Add(time.Minute); ; {
		doc, err := OpenAPIv2(ctx, cluster.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		written, err := WriteSchemas(doc, schemaDir, func(apiVersion, kind string) bool { return want[SchemaFileName(apiVersion, kind)] })
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, w := range written {
			have[w] = true
		}
		missing = missing[:0]
		for w := range want {
			if !have[w] {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(missing) > 0 {
		t.Fatalf("no schema in the API server's OpenAPI for %v", missing)
	}
	for _, v := range variants() {
		var b bytes.Buffer
		for _, d := range outs[v.name] {
			b.WriteString("---\n")
			b.Write(d.YAML)
		}
		f := filepath.Join(t.TempDir(), v.name+".yaml")
		if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, bin, "-strict", "-summary", "-output", "text",
			"-schema-location", schemaDir+"/{{ .ResourceKind }}{{ .KindSuffix }}.json", f)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("kubeconform %s: %v\n%s", v.name, err, out)
			continue
		}
		if !strings.Contains(string(out), fmt.Sprintf("Valid: %d", len(outs[v.name]))) {
			t.Errorf("kubeconform %s did not validate all %d objects:\n%s", v.name, len(outs[v.name]), out)
		}
		t.Logf("kubeconform %s: %s", v.name, strings.TrimSpace(string(out)))
	}
}

// TestServerSideDryRun applies every variant to the real kube-apiserver
// with server-side apply, dry-run, strict field validation: the API server
// checks every object as it would at `helm install`.
func TestServerSideDryRun(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t, 5*time.Minute)
	cfg := cluster.AdminConfig()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			// Dry-run objects of a namespace that does not exist are refused:
			// the namespace is created for real.
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v.namespace}}
			if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
				t.Fatal(err)
			}
			for _, d := range render(t, v) {
				gv, err := schema.ParseGroupVersion(d.APIVersion)
				if err != nil {
					t.Fatal(err)
				}
				m, err := mapper.RESTMapping(gv.WithKind(d.Kind).GroupKind(), gv.Version)
				if err != nil {
					t.Errorf("%s: %v", d.ID(), err)
					continue
				}
				var ri dynamic.ResourceInterface = dc.Resource(m.Resource)
				if m.Scope.Name() == meta.RESTScopeNameNamespace {
					ri = dc.Resource(m.Resource).Namespace(d.Namespace)
				}
				body, err := yaml.YAMLToJSON(d.YAML)
				if err != nil {
					t.Fatal(err)
				}
				_, err = ri.Patch(ctx, d.Name, types.ApplyPatchType, body, metav1.PatchOptions{
					DryRun: []string{metav1.DryRunAll}, FieldManager: "eventpipe-chart-check", Force: ptr(true), FieldValidation: "Strict",
				})
				if err != nil {
					t.Errorf("dry-run apply %s (%s): %v", d.ID(), d.Source, err)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// placeholder: the plain manifests carry cluster CHANGE-ME, which the
// binaries refuse until the operator names the cluster. For that variant it
// checks the refusal and returns the config with a real name; others are
// returned as they are.
func placeholder(t *testing.T, v variant, config string, validate func([]byte) error) string {
	t.Helper()
	if !strings.HasPrefix(v.name, "manifests") {
		return config
	}
	if err := validate([]byte(config)); err == nil || !strings.Contains(err.Error(), "CHANGE-ME") {
		t.Errorf("the manifests' config with cluster CHANGE-ME: got %v, want the placeholder refused", err)
	}
	return strings.ReplaceAll(config, "CHANGE-ME", "prod-eu-1")
}

// kafkaMode: the variant runs the collector with log: kafka.
func kafkaMode(v variant) bool { return strings.Contains(v.name, "kafka") }

// hasCollector: the variant installs a collector (all but the agent alone,
// which ships to collectors elsewhere).
func hasCollector(v variant) bool { return v.name != "agent-only" }

// collectorWorkload is the collector's StatefulSet or Deployment.
func collectorWorkload(docs []Doc) (Doc, bool) {
	for _, d := range docs {
		if (d.Kind == "StatefulSet" || d.Kind == "Deployment") && strings.HasSuffix(d.Name, "-collector") {
			return d, true
		}
	}
	return Doc{}, false
}

// TestCollectorModes: log: local renders the collector as today (a
// one-replica StatefulSet whose log is on a PersistentVolumeClaim);
// log: kafka renders a Deployment of collector.replicas with no claim and
// no data volume (nothing on its disks matters), spread over nodes and
// zones, under a PodDisruptionBudget; the agent reaches every replica
// through the one Service.
func TestCollectorModes(t *testing.T) {
	for _, v := range variants() {
		if !hasCollector(v) {
			continue // TestAgentCollectorAddresses
		}
		t.Run(v.name, func(t *testing.T) {
			docs := render(t, v)
			w, ok := collectorWorkload(docs)
			if !ok {
				t.Fatal("no collector workload")
			}
			var spec corev1.PodSpec
			if s, ok := podSpec(w); ok {
				spec = s
			} else {
				t.Fatalf("%s: no pod spec", w.ID())
			}
			replicas, _, _ := unstructured.NestedFieldNoCopy(w.Object, "spec", "replicas")
			if checksum, _, _ := unstructured.NestedString(w.Object, "spec", "template", "metadata", "annotations", "checksum/config"); checksum == "" {
				// A change the collector applies only at start-up must roll
				// it (TestCollectorConfigChecksum: which changes do).
				t.Errorf("%s: no checksum/config annotation", w.ID())
			}
			claims, hasClaims, _ := unstructured.NestedSlice(w.Object, "spec", "volumeClaimTemplates")
			mounts := map[string]string{}
			for _, c := range spec.Containers {
				for _, m := range c.VolumeMounts {
					mounts[m.MountPath] = m.Name
				}
			}
			for _, vol := range spec.Volumes {
				if vol.PersistentVolumeClaim != nil || vol.HostPath != nil || vol.Ephemeral != nil {
					t.Errorf("%s: volume %s is a disk that outlives or binds the pod", w.ID(), vol.Name)
				}
			}
			if kafkaMode(v) {
				want := map[string]float64{"kafka": 3, "manifests-kafka": 3}[v.name]
				if w.Kind != "Deployment" || replicas != want {
					t.Errorf("kafka mode: %s with replicas %v, want a Deployment of %v", w.ID(), replicas, want)
				}
				if hasClaims || mounts["/var/lib/eventpipe"] != "" {
					t.Errorf("kafka mode has a data volume: claims %v, mounts %v", claims, mounts)
				}
				for _, d := range docs {
					if d.Kind == "PersistentVolumeClaim" {
						t.Errorf("kafka mode renders %s", d.ID())
					}
				}
				if len(spec.TopologySpreadConstraints) == 0 || spec.TopologySpreadConstraints[0].TopologyKey != "topology.kubernetes.io/zone" {
					t.Errorf("kafka mode: topology spread %+v, want the zone spread", spec.TopologySpreadConstraints)
				}
				if mu, _, _ := unstructured.NestedFieldNoCopy(w.Object, "spec", "strategy", "rollingUpdate", "maxUnavailable"); mu != float64(0) {
					t.Errorf("kafka mode: rolling update maxUnavailable %v, want 0 (a new replica joins before an old one leaves)", mu)
				}
				if v.name == "kafka" && (mounts["/var/run/secrets/eventpipe/backbone/password"] == "" || mounts["/var/run/secrets/eventpipe/backbone/tls"] == "") {
					t.Errorf("kafka mode: the backbone's SASL password and CA are not mounted: %v", mounts)
				}
			} else {
				if w.Kind != "StatefulSet" || replicas != float64(1) {
					t.Errorf("local mode: %s with replicas %v, want a StatefulSet of 1", w.ID(), replicas)
				}
				if len(claims) != 1 || mounts["/var/lib/eventpipe"] != "data" {
					t.Errorf("local mode: claims %v, mounts %v; want the data claim on /var/lib/eventpipe", claims, mounts)
				} else if name, _, _ := unstructured.NestedString(claims[0].(map[string]any), "metadata", "name"); name != "data" {
					t.Errorf("local mode: claim %q, want data (alerts and runbooks name data-<collector>-0)", name)
				}
				if len(spec.TopologySpreadConstraints) != 0 {
					t.Errorf("local mode: topology spread %+v on one replica", spec.TopologySpreadConstraints)
				}
			}
			pdb := false
			for _, d := range docs {
				if d.Kind == "PodDisruptionBudget" && d.Name == w.Name {
					pdb = true
				}
			}
			// A budget only for 2+ replicas (kafka mode): one replica's budget
			// blocks drains or does nothing.
			if want := kafkaMode(v); pdb != want {
				t.Errorf("PodDisruptionBudget for %s (replicas %v): %v, want %v", w.ID(), replicas, pdb, want)
			}
			for _, d := range docs {
				data, _ := d.Object["data"].(map[string]any)
				s, ok := data["agent.yaml"].(string)
				if d.Kind != "ConfigMap" || !ok {
					continue
				}
				cfg, err := agent.ParseConfig([]byte(s))
				if err != nil {
					t.Fatal(err)
				}
				if want := w.Name + "." + v.namespace + ".svc:7070"; cfg.Collector.Address != want || len(cfg.Collector.Addresses) != 0 {
					t.Errorf("agent's collector address %q (addresses %q), want only the Service %q", cfg.Collector.Address, cfg.Collector.Addresses, want)
				}
			}
		})
	}
}

// TestAgentCollectorAddresses: agent.collector.addresses becomes the
// agent's collector.addresses (and no address: the agent refuses both),
// for collectors outside the release: with the release's collector (Kafka
// mode, which by default the agent reaches through its Service) and
// without one (the agent-only variant, which kubeconform and the dry-run
// also check). A changed list rolls the agent. Without a collector in the
// release the list is required, and each entry must be host:port, once.
func TestAgentCollectorAddresses(t *testing.T) {
	v := func(f string) string { return filepath.Join(root, "deploy", "check", "testdata", "values", f) }
	addrs := []string{"collectors-a.example.com:7070", "collectors-b.example.com:7070"}
	agentOf := func(t *testing.T, values []string, set []string) (agent.Config, string) {
		t.Helper()
		docs, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", values, set)
		if err != nil {
			t.Fatalf("helm template %v %v: %v", values, set, err)
		}
		var cfg agent.Config
		var checksum string
		for _, d := range docs {
			data, _ := d.Object["data"].(map[string]any)
			if s, ok := data["agent.yaml"].(string); ok && d.Kind == "ConfigMap" {
				if cfg, err = agent.ParseConfig([]byte(s)); err != nil {
					t.Fatal(err)
				}
			}
			if d.Kind == "Deployment" && strings.HasSuffix(d.Name, "-agent") {
				checksum, _, _ = unstructured.NestedString(d.Object, "spec", "template", "metadata", "annotations", "checksum/config")
			}
		}
		if checksum == "" {
			t.Fatal("no agent Deployment with a checksum/config annotation")
		}
		return cfg, checksum
	}
	_, serviceSum := agentOf(t, []string{v("kafka.yaml")}, nil)
	for name, c := range map[string]struct{ values, set []string }{
		"kafka mode, collectors elsewhere": {[]string{v("kafka.yaml")}, []string{"agent.collector.addresses={" + strings.Join(addrs, ",") + "}"}},
		"agent only":                       {[]string{v("agent-only.yaml")}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, sum := agentOf(t, c.values, c.set)
			if cfg.Collector.Address != "" || strings.Join(cfg.Collector.Addresses, " ") != strings.Join(addrs, " ") {
				t.Errorf("agent's collector: address %q, addresses %q; want addresses %q and no address", cfg.Collector.Address, cfg.Collector.Addresses, addrs)
			}
			cfg.Collector.TokenFile, cfg.Collector.CAFile = "", "" // files on the pod
			if err := cfg.Validate(); err != nil {
				t.Errorf("the agent refuses the config: %v", err)
			}
			if sum == serviceSum {
				t.Error("the agent's checksum/config did not change with its collector addresses: the agent would not roll")
			}
		})
	}
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"no collector and no addresses", []string{"collector.enabled=false"}, "at '/agent/collector/addresses': minItems"},
		{"address without port", []string{"agent.collector.addresses={collectors-a.example.com}"}, "/agent/collector/addresses/0"},
		{"address twice", []string{"agent.collector.addresses={a.example.com:7070,a.example.com:7070}"}, "/agent/collector/addresses"},
		{"a URL, not host:port", []string{"agent.collector.addresses={https://a.example.com:7070}"}, "/agent/collector/addresses/0"},
	} {
		_, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", nil, c.set)
		if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (--set %v): got %v, want a schema error naming %q", c.name, c.set, err, c.want)
		}
	}
	// Without addresses, a disabled agent needs none.
	if _, err := Render(ctxT(t, 2*time.Minute), root, "eventpipe", "eventpipe", nil, []string{"collector.enabled=false", "agent.enabled=false"}); err != nil {
		t.Errorf("neither agent nor collector: %v", err)
	}
}
