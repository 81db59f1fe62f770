package openshell

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/eventpipe/eventpipe/testenv/kube"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, kube.LeakOptions()...) }

const (
	socketDir   = "/var/run/openshell-compute"
	proxySocket = socketDir + "/proxy/proxy.sock"
	driverSock  = socketDir + "/driver/driver.sock"
)

// testProxyImage stands in for the release image a stamped binary
// defaults to.
const testProxyImage = Image + ":9.8.7"

// run is `eventpipe post-render` (cmd/eventpipe/postrender.go) as a
// function of this package: flags, stdin, Render, stdout; exit 2 for bad
// flags or options, 1 when the manifests cannot be patched.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var o Options
	fs := flag.NewFlagSet("post-render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs, testProxyImage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		return 1
	}
	out, err := Render(in, o)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	_, _ = stdout.Write(out)
	return 0
}

func renderFile(t *testing.T, path string, args ...string) (int, string, string) {
	t.Helper()
	in, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run(args, bytes.NewReader(in), &out, &errb)
	return code, out.String(), errb.String()
}

// docsOf splits the output and returns the gateway workload's pod template
// and every other document.
func podOf(t *testing.T, out, kind string) (corev1.PodTemplateSpec, []string) {
	t.Helper()
	var pod corev1.PodTemplateSpec
	var others []string
	found := false
	for _, part := range docSep.Split(out, -1) {
		if strings.TrimSpace(stripComments(part)) == "" {
			continue
		}
		if strings.Contains(part, "\nkind: "+kind+"\n") || strings.HasPrefix(part, "kind: "+kind+"\n") || strings.Contains(part, "kind: "+kind+"\n") && strings.Contains(part, "openshell-gateway") {
			switch kind {
			case "StatefulSet":
				var s appsv1.StatefulSet
				if err := yaml.UnmarshalStrict([]byte(part), &s); err != nil {
					t.Fatalf("output StatefulSet does not decode strictly: %v", err)
				}
				pod = s.Spec.Template
			case "Deployment":
				var d appsv1.Deployment
				if err := yaml.UnmarshalStrict([]byte(part), &d); err != nil {
					t.Fatalf("output Deployment does not decode strictly: %v", err)
				}
				pod = d.Spec.Template
			}
			found = true
			continue
		}
		others = append(others, part)
	}
	if !found {
		t.Fatalf("no %s in the output:\n%s", kind, out)
	}
	return pod, others
}

func container(t *testing.T, pod corev1.PodTemplateSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s (have %v)", name, names(pod))
	return corev1.Container{}
}

func names(pod corev1.PodTemplateSpec) []string {
	var n []string
	for _, c := range pod.Spec.Containers {
		n = append(n, c.Name)
	}
	return n
}

func env(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func argAfter(args []string, flag string) string {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

func TestRenderOverTheChartsGateway(t *testing.T) {
	code, out, errs := renderFile(t, "testdata/rendered.yaml",
		"--collector", "eventpipe-collector.eventpipe.svc:7070", "--proxy-image", "ghcr.io/eventpipe/eventpipe:v0.2.0",
		"--driver-image", "ghcr.io/example/openshell-driver:0.1.4", "--driver-env", "OPENSHELL_LOG_LEVEL=debug")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	pod, others := podOf(t, out, "StatefulSet")

	// Three containers, the gateway's own settings kept.
	if got := names(pod); !slices.Equal(got, []string{gatewayContainer, proxyContainer, driverContainer}) {
		t.Errorf("containers %v", got)
	}
	gw := container(t, pod, gatewayContainer)
	if gw.Image != "ghcr.io/nvidia/openshell/gateway:0.1.4" || argAfter(gw.Args, "--config") != "/etc/openshell/gateway.toml" ||
		gw.ReadinessProbe == nil || len(gw.Ports) != 2 {
		t.Errorf("the gateway container lost its settings: %+v", gw)
	}
	ge := env(gw)
	if ge["OPENSHELL_DRIVERS"] != "kubernetes" || ge["OPENSHELL_COMPUTE_DRIVER_SOCKET"] != proxySocket || ge["OPENSHELL_TELEMETRY_ENABLED"] != "true" {
		t.Errorf("gateway env %v", ge)
	}
	if !slices.ContainsFunc(gw.Env, func(e corev1.EnvVar) bool { return e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil }) {
		t.Errorf("the gateway's secret-backed env was lost: %+v", gw.Env)
	}

	// One shared emptyDir socket directory, mounted in all three.
	var socketVol string
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil {
			if socketVol != "" {
				t.Errorf("two emptyDir volumes")
			}
			socketVol = v.Name
		}
	}
	if socketVol == "" {
		t.Fatalf("no emptyDir volume: %+v", pod.Spec.Volumes)
	}
	for _, c := range pod.Spec.Containers {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == socketVol && m.MountPath == socketDir }) {
			t.Errorf("container %s does not mount %s at %s: %+v", c.Name, socketVol, socketDir, c.VolumeMounts)
		}
	}
	for _, keep := range []string{"gateway-config", "sandbox-jwt", proxySecret} {
		if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == keep }) {
			t.Errorf("volume %s missing", keep)
		}
	}

	// All as one uid, non-root.
	for _, c := range pod.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1000 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("container %s: securityContext %+v, want runAsUser 1000 non-root", c.Name, sc)
		}
	}
	if fg := pod.Spec.SecurityContext.FSGroup; fg == nil || *fg != 1000 {
		t.Errorf("fsGroup %v", fg)
	}

	// The chain: gateway -> proxy --listen; proxy --driver = driver --bind-socket.
	px := container(t, pod, proxyContainer)
	if px.Image != "ghcr.io/eventpipe/eventpipe:v0.2.0" || px.Args[0] != "driver-proxy" || argAfter(px.Args, "--listen") != proxySocket ||
		argAfter(px.Args, "--driver") != driverSock || argAfter(px.Args, "--gateway") != "openshell" ||
		argAfter(px.Args, "--collector") != "eventpipe-collector.eventpipe.svc:7070" ||
		argAfter(px.Args, "--token-file") != "/etc/eventpipe/token" || argAfter(px.Args, "--ca") != "/etc/eventpipe/ca.crt" {
		t.Errorf("proxy: image %s args %q", px.Image, px.Args)
	}
	// The proxy serves /metrics and its probes on its own port, and the
	// pod carries the label the eventpipe chart's PodMonitor selects.
	if argAfter(px.Args, "--metrics-listen") != ":9465" || len(px.Ports) != 1 || px.Ports[0].Name != ProxyMetricsPortName || px.Ports[0].ContainerPort != 9465 {
		t.Errorf("proxy metrics: args %q ports %+v", px.Args, px.Ports)
	}
	if px.ReadinessProbe == nil || px.ReadinessProbe.HTTPGet == nil || px.ReadinessProbe.HTTPGet.Path != "/readyz" || px.ReadinessProbe.HTTPGet.Port.StrVal != ProxyMetricsPortName ||
		px.LivenessProbe == nil || px.LivenessProbe.HTTPGet == nil || px.LivenessProbe.HTTPGet.Path != "/healthz" || px.LivenessProbe.HTTPGet.Port.StrVal != ProxyMetricsPortName {
		t.Errorf("proxy probes: readiness %+v liveness %+v", px.ReadinessProbe, px.LivenessProbe)
	}
	if pod.Labels[ProxyPodLabel] != "true" || pod.Labels["app.kubernetes.io/name"] == "" {
		t.Errorf("pod labels %v: want %s=true next to the chart's", pod.Labels, ProxyPodLabel)
	}
	dr := container(t, pod, driverContainer)
	if dr.Image != "ghcr.io/example/openshell-driver:0.1.4" || argAfter(dr.Args, "--bind-socket") != driverSock {
		t.Errorf("driver: image %s args %q", dr.Image, dr.Args)
	}
	de := env(dr)
	want := map[string]string{
		"OPENSHELL_WORKSPACE_MODE": "managed", "OPENSHELL_GATEWAY_ID": "openshell",
		"OPENSHELL_SANDBOX_NAMESPACE": "openshell", "OPENSHELL_K8S_SANDBOX_SERVICE_ACCOUNT": "openshell-sandbox",
		"OPENSHELL_GRPC_ENDPOINT":          "https://openshell.openshell.svc.cluster.local:8080",
		"OPENSHELL_SANDBOX_IMAGE":          "ghcr.io/nvidia/openshell-community/sandboxes/base:latest",
		"OPENSHELL_CLIENT_TLS_SECRET_NAME": "openshell-client-tls", "OPENSHELL_SUPERVISOR_SIDELOAD_METHOD": "image-volume",
		"OPENSHELL_K8S_TOPOLOGY": "combined", "OPENSHELL_LOG_LEVEL": "debug", "OPENSHELL_SANDBOX_IMAGE_PULL_SECRETS": "regcred",
	}
	for k, v := range want {
		if de[k] != v {
			t.Errorf("driver env %s=%q, want %q", k, de[k], v)
		}
	}

	// Everything else passes through unchanged.
	in, _ := os.ReadFile("testdata/rendered.yaml")
	for _, o := range others {
		if !strings.Contains(string(in), strings.TrimSpace(o)) {
			t.Errorf("a document changed:\n%s", o)
		}
	}
	if len(others) != 3 {
		t.Errorf("%d other documents, want 3", len(others))
	}
	// The volumeClaimTemplates of the StatefulSet survive.
	if !strings.Contains(out, "volumeClaimTemplates:") || !strings.Contains(out, "storage: 1Gi") {
		t.Errorf("volumeClaimTemplates lost")
	}
}

func TestRenderDeploymentInsecureAndUID(t *testing.T) {
	in, _ := os.ReadFile("testdata/rendered.yaml")
	s := strings.Replace(string(in), "kind: StatefulSet", "kind: Deployment", 1)
	s = s[:strings.Index(s, "  volumeClaimTemplates:")]
	s = strings.Replace(s, "  serviceName: openshell\n", "", 1)
	s = strings.Replace(s, "            runAsUser: 1000\n          image:", "            runAsUser: 1234\n          image:", 1)
	var out, errb bytes.Buffer
	if code := run([]string{"--collector", "c:7070", "--insecure"}, strings.NewReader(s), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	pod, _ := podOf(t, out.String(), "Deployment")
	for _, c := range pod.Spec.Containers {
		if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1234 {
			t.Errorf("container %s: uid %v, want the gateway's 1234", c.Name, sc)
		}
	}
	px := container(t, pod, proxyContainer)
	if slices.Contains(px.Args, "--ca") || !slices.Contains(px.Args, "--insecure") {
		t.Errorf("insecure proxy args %q", px.Args)
	}
	if px.Image != testProxyImage {
		t.Errorf("proxy image %q, want the binary's release image %q", px.Image, testProxyImage)
	}
	if dr := container(t, pod, driverContainer); dr.Image != "ghcr.io/nvidia/openshell/gateway:0.1.4" {
		t.Errorf("driver image defaults to the gateway's, got %s", dr.Image)
	}
}

func TestRenderRefuses(t *testing.T) {
	in, _ := os.ReadFile("testdata/rendered.yaml")
	tests := []struct {
		name, input string
		args        []string
		code        int
		want        string
	}{
		{"operator mode", strings.Replace(string(in), `workspace_mode               = "managed"`, `workspace_mode               = "operator"`, 1),
			[]string{"--collector", "c:7070"}, 1, "refuses an out-of-process Kubernetes driver in operator mode"},
		{"no gateway workload", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", []string{"--collector", "c:7070"}, 1, "no StatefulSet or Deployment"},
		{"wrong name", string(in), []string{"--collector", "c:7070", "--name", "other"}, 1, "no StatefulSet or Deployment"},
		{"no collector", string(in), nil, 2, "--collector is required"},
		{"bad driver env", string(in), []string{"--collector", "c:7070", "--driver-env", "NOEQUALS"}, 2, "want KEY=VALUE"},
		{"no proxy image (an unstamped build)", string(in), []string{"--collector", "c:7070", "--proxy-image", ""}, 2, "--proxy-image is required"},
		{"bad metrics port", string(in), []string{"--collector", "c:7070", "--metrics-port", "70000"}, 2, "want a port number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, strings.NewReader(tt.input), &out, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("exit %d (want %d), stderr %q (want %q)", code, tt.code, errb.String(), tt.want)
			}
			if out.Len() != 0 {
				t.Errorf("wrote output on failure")
			}
		})
	}
}

// kustomization.yaml uses gateway-patch.yaml over the chart's StatefulSet,
// and maps the patch's image names; the patch is a valid StatefulSet
// fragment with the three containers.
func TestKustomizationMatchesThePatch(t *testing.T) {
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string
		Patches   []struct {
			Path   string
			Target struct{ Group, Version, Kind, Name string }
		}
		Images []struct{ Name, NewName, NewTag string } `json:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Patches) != 1 || k.Patches[0].Path != "gateway-patch.yaml" || k.Patches[0].Target.Kind != "StatefulSet" || k.Patches[0].Target.Name != "openshell" {
		t.Errorf("kustomization patches: %+v", k.Patches)
	}
	var p appsv1.StatefulSet
	if err := yaml.UnmarshalStrict(patchYAML, &p); err != nil {
		t.Fatal(err)
	}
	images := map[string]bool{}
	for _, i := range k.Images {
		images[i.Name] = true
	}
	for _, c := range p.Spec.Template.Spec.Containers {
		if c.Image != "" && !images[c.Image] {
			t.Errorf("container %s image %q has no images: entry in kustomization.yaml", c.Name, c.Image)
		}
	}
	if got := names(p.Spec.Template); !slices.Equal(got, []string{gatewayContainer, proxyContainer, driverContainer}) {
		t.Errorf("patch containers %v", got)
	}
}

// The patched StatefulSet is accepted by a real kube-apiserver (server-side
// dry run: schema, defaulting, validation of volumes, mounts and
// securityContext).
func TestRenderedWorkloadPassesServerSideDryRun(t *testing.T) {
	code, out, errs := renderFile(t, "testdata/rendered.yaml", "--collector", "eventpipe-collector.eventpipe.svc:7070")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var sts appsv1.StatefulSet
	for _, part := range docSep.Split(out, -1) {
		if strings.Contains(part, "kind: StatefulSet") {
			if err := yaml.UnmarshalStrict([]byte(part), &sts); err != nil {
				t.Fatal(err)
			}
		}
	}
	cl := kube.Start(t)
	cs, err := kubernetes.NewForConfig(cl.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "openshell"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := cs.AppsV1().StatefulSets("openshell").Create(ctx, &sts, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("server-side dry run refused the patched StatefulSet: %v", err)
	}
	if n := len(got.Spec.Template.Spec.Containers); n != 3 {
		t.Errorf("the apiserver kept %d containers", n)
	}
}

func TestReleaseImage(t *testing.T) {
	for v, want := range map[string]string{
		"0.3.0":                              Image + ":0.3.0",
		"v1.2.3":                             Image + ":1.2.3",
		"1.0.0-rc.1":                         Image + ":1.0.0-rc.1",
		"dev":                                "",
		"v0.0.0-20261204233722-b5c53281a2f0": "",
		"latest":                             "",
	} {
		if got := ReleaseImage(v); got != want {
			t.Errorf("ReleaseImage(%q) = %q, want %q", v, got, want)
		}
	}
}
