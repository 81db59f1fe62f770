// Package openshell is eventpipe's Helm post-renderer for the OpenShell
// chart (`eventpipe post-render`): it takes the chart's rendered manifests
// and returns them with the gateway workload running the gateway,
// eventpipe's driver proxy and openshell-driver-kubernetes as three
// containers of one pod (one uid, shared emptyDir socket directory), the
// gateway told to dial the proxy, the proxy serving /metrics, /healthz and
// /readyz on its own port and its pod labelled for the eventpipe chart's
// PodMonitor.
//
//	helm upgrade --install openshell <chart> -n openshell -f my-values.yaml \
//	  --post-renderer eventpipe --post-renderer-args post-render \
//	  --post-renderer-args --collector=eventpipe-collector.eventpipe.svc:7070
//
// The patch is gateway-patch.yaml (the same file kustomization.yaml uses),
// applied as a strategic-merge patch; the driver's settings are copied from
// the chart's gateway.toml ConfigMap into the driver's environment (the
// driver binary reads them from there). See README.md.
package openshell

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"github.com/eventpipe/eventpipe/api/cliflag"
)

//go:embed gateway-patch.yaml
var patchYAML []byte

// Names in gateway-patch.yaml.
const (
	gatewayContainer = "openshell-gateway"
	proxyContainer   = "eventpipe-driver-proxy"
	driverContainer  = "kubernetes-compute-driver"
	proxySecret      = "eventpipe-driver-proxy"
)

// ProxyPodLabel marks the gateway pod running the driver proxy: the
// eventpipe chart's driver-proxy PodMonitor selects it
// (monitoring.driverProxy).
const ProxyPodLabel = "eventpipe.io/driver-proxy"

// ProxyMetricsPortName is the proxy container's port for /metrics,
// /healthz and /readyz (the PodMonitor scrapes it by name).
const ProxyMetricsPortName = "proxy-metrics"

// Image is eventpipe's image repository; a release's binary defaults the
// proxy image to Image:<its version> (one version for the binary, the
// image, the chart and this post-renderer).
const Image = "ghcr.io/eventpipe/eventpipe"

// releaseVersion is what `make release VERSION=...` accepts (x.y.z with an
// optional -alpha.N, -beta.N or -rc.N); module pseudo-versions and "dev"
// are not releases and have no image.
var releaseVersion = regexp.MustCompile(`^v?([0-9]+\.[0-9]+\.[0-9]+(-(alpha|beta|rc)\.[0-9]+)?)$`)

// ReleaseImage is the image of the release a binary reports as its
// version (Image:x.y.z), or "" when the version is not a release.
func ReleaseImage(version string) string {
	m := releaseVersion.FindStringSubmatch(version)
	if m == nil {
		return ""
	}
	return Image + ":" + m[1]
}

// Options say how to patch the gateway workload.
type Options struct {
	Kind, Name  string
	ProxyImage  string
	DriverImage string
	Collector   string
	GatewayID   string
	Secret      string
	Insecure    bool
	UID         int64
	DriverEnv   []string
	MetricsPort int32
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// AddFlags registers the post-renderer's flags on fs, with the proxy image
// defaulting to defaultProxyImage ("" for a build that does not know its
// release: then --proxy-image is required).
func (o *Options) AddFlags(fs *flag.FlagSet, defaultProxyImage string) {
	fs.StringVar(&o.Kind, "kind", "", "the gateway workload's kind, StatefulSet or Deployment (default: whichever has a container "+gatewayContainer+")")
	fs.StringVar(&o.Name, "name", "", "the gateway workload's name (default: the one with a container "+gatewayContainer+")")
	fs.StringVar(&o.ProxyImage, "proxy-image", defaultProxyImage, "eventpipe's image for the proxy (default: this binary's release, "+Image+":<version>)")
	fs.StringVar(&o.DriverImage, "driver-image", "", "an image holding /usr/local/bin/openshell-driver-kubernetes (default: the gateway's image)")
	fs.StringVar(&o.Collector, "collector", "", "the collector's gRPC address host:port (required)")
	fs.StringVar(&o.GatewayID, "gateway", "", "the gateway id (default: gateway_id of the chart's gateway.toml, else openshell)")
	cliflag.Deprecated(fs, "gateway-id", "gateway", fs.Output())
	fs.StringVar(&o.Secret, "secret", proxySecret, "Secret with the proxy's reader token (key token) and the collector's CA (key ca.crt)")
	fs.BoolVar(&o.Insecure, "insecure", false, "plaintext gRPC to the collector (no ca.crt)")
	fs.Int64Var(&o.UID, "uid", 0, "uid of all three containers (default: the gateway container's runAsUser, else 1000)")
	fs.Var((*multiFlag)(&o.DriverEnv), "driver-env", "KEY=VALUE for the driver's environment, over what gateway.toml gives (repeatable)")
	var port int
	fs.Func("metrics-port", "the proxy's port for /metrics, /healthz and /readyz (default 9465)", func(s string) error {
		if _, err := fmt.Sscan(s, &port); err != nil || port < 1 || port > 65535 {
			return fmt.Errorf("want a port number, got %q", s)
		}
		o.MetricsPort = int32(port)
		return nil
	})
}

// Validate reports every missing or malformed option.
func (o Options) Validate() error {
	var errs []error
	if o.Collector == "" {
		errs = append(errs, errors.New("--collector is required (the collector's gRPC address)"))
	}
	if o.ProxyImage == "" {
		errs = append(errs, errors.New("--proxy-image is required: this build does not know its release version (a release binary defaults to "+Image+":<version>)"))
	}
	for _, kv := range o.DriverEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("--driver-env %q: want KEY=VALUE", kv))
		}
	}
	return errors.Join(errs...)
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

type doc struct {
	text string
	obj  map[string]any
}

// Render patches the gateway workload of the manifests in (Helm's
// post-renderer input) and returns all of them.
func Render(in []byte, o Options) ([]byte, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.MetricsPort == 0 {
		o.MetricsPort = 9465
	}
	var docs []doc
	for _, part := range docSep.Split(string(in), -1) {
		if strings.TrimSpace(stripComments(part)) == "" {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(part), &obj); err != nil {
			return nil, fmt.Errorf("parse a manifest: %w", err)
		}
		docs = append(docs, doc{text: part, obj: obj})
	}
	toml := gatewayTOML(docs)
	if mode := toml["openshell.drivers.kubernetes"]["workspace_mode"]; mode == "operator" {
		return nil, errors.New("workspace_mode is operator: the gateway refuses an out-of-process Kubernetes driver in operator mode; " +
			"use eventpipe follow / eventpipe diagnose (the collector's Follow stream) instead")
	}
	target := -1
	for i, d := range docs {
		kind, _ := d.obj["kind"].(string)
		name, _ := nested(d.obj, "metadata", "name").(string)
		if kind != "StatefulSet" && kind != "Deployment" {
			continue
		}
		if (o.Kind != "" && kind != o.Kind) || (o.Name != "" && name != o.Name) || !hasContainer(d.obj, gatewayContainer) {
			continue
		}
		if target >= 0 {
			return nil, fmt.Errorf("two gateway workloads (%s and %s %s): pass --kind and --name", describe(docs[target].obj), kind, name)
		}
		target = i
	}
	if target < 0 {
		return nil, fmt.Errorf("no StatefulSet or Deployment with a container %q in the manifests (--kind %q --name %q)", gatewayContainer, o.Kind, o.Name)
	}
	patched, err := patchWorkload(docs[target].obj, toml, o)
	if err != nil {
		return nil, fmt.Errorf("patch %s: %w", describe(docs[target].obj), err)
	}
	var b bytes.Buffer
	for i, d := range docs {
		if i > 0 {
			b.WriteString("---\n")
		}
		if i == target {
			b.Write(patched)
			continue
		}
		b.WriteString(strings.TrimLeft(d.text, "\n"))
		if !strings.HasSuffix(d.text, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.Bytes(), nil
}

func describe(obj map[string]any) string {
	k, _ := obj["kind"].(string)
	n, _ := nested(obj, "metadata", "name").(string)
	return k + " " + n
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func nested(obj map[string]any, path ...string) any {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func hasContainer(obj map[string]any, name string) bool {
	cs, _ := nested(obj, "spec", "template", "spec", "containers").([]any)
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["name"] == name {
			return true
		}
	}
	return false
}

// gatewayTOML reads the flat string keys of every [section] of the chart's
// gateway.toml (the ConfigMap key gateway.toml): enough for the values the
// driver needs, which the chart writes as `key = "value"` or bare words.
func gatewayTOML(docs []doc) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, d := range docs {
		if d.obj["kind"] != "ConfigMap" {
			continue
		}
		text, _ := nested(d.obj, "data", "gateway.toml").(string)
		if text == "" {
			continue
		}
		section := ""
		sc := bufio.NewScanner(strings.NewReader(text))
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			switch {
			case l == "" || strings.HasPrefix(l, "#"):
			case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
				section = strings.Trim(l, "[] ")
			default:
				k, v, ok := strings.Cut(l, "=")
				if !ok {
					continue
				}
				k, v = strings.TrimSpace(k), strings.TrimSpace(v)
				if strings.HasPrefix(v, `"`) {
					uq, err := strconv.Unquote(v)
					if err != nil {
						continue // an array or an escaped string: not a value the driver needs
					}
					v = uq
				} else if strings.HasPrefix(v, "[") {
					// A list of strings (image_pull_secrets) becomes the
					// comma-separated form the driver's flags take.
					var list []string
					if err := json.Unmarshal([]byte(v), &list); err != nil {
						continue
					}
					v = strings.Join(list, ",")
				}
				if out[section] == nil {
					out[section] = map[string]string{}
				}
				out[section][k] = v
			}
		}
	}
	return out
}

// driverEnvFromTOML maps gateway.toml keys to the environment variables
// openshell-driver-kubernetes reads (its flags' env names).
var driverEnvFromTOML = []struct{ section, key, env string }{
	{"openshell.drivers.kubernetes", "workspace_mode", "OPENSHELL_WORKSPACE_MODE"},
	{"openshell.drivers.kubernetes", "gateway_id", "OPENSHELL_GATEWAY_ID"},
	{"openshell.drivers.kubernetes", "grpc_endpoint", "OPENSHELL_GRPC_ENDPOINT"},
	{"openshell.drivers.kubernetes", "service_account_name", "OPENSHELL_K8S_SANDBOX_SERVICE_ACCOUNT"},
	{"openshell.drivers.kubernetes", "operator_namespace_label", "OPENSHELL_OPERATOR_NAMESPACE_LABEL"},
	{"openshell.drivers.kubernetes", "supervisor_sideload_method", "OPENSHELL_SUPERVISOR_SIDELOAD_METHOD"},
	{"openshell.drivers.kubernetes", "topology", "OPENSHELL_K8S_TOPOLOGY"},
	{"openshell.drivers.kubernetes", "image_pull_policy", "OPENSHELL_SANDBOX_IMAGE_PULL_POLICY"},
	{"openshell.drivers.kubernetes", "image_pull_secrets", "OPENSHELL_SANDBOX_IMAGE_PULL_SECRETS"},
	{"openshell.drivers.kubernetes", "supervisor_image_pull_policy", "OPENSHELL_SUPERVISOR_IMAGE_PULL_POLICY"},
	{"openshell.gateway", "sandbox_namespace", "OPENSHELL_SANDBOX_NAMESPACE"},
	{"openshell.gateway", "default_image", "OPENSHELL_SANDBOX_IMAGE"},
	{"openshell.gateway", "supervisor_image", "OPENSHELL_SUPERVISOR_IMAGE"},
	{"openshell.gateway", "client_tls_secret_name", "OPENSHELL_CLIENT_TLS_SECRET_NAME"},
	{"openshell.gateway", "host_gateway_ip", "OPENSHELL_HOST_GATEWAY_IP"},
}

func patchWorkload(obj map[string]any, toml map[string]map[string]string, o Options) ([]byte, error) {
	kind, _ := obj["kind"].(string)
	name, _ := nested(obj, "metadata", "name").(string)
	// The workload as a typed object: its gateway container tells the uid
	// and the default driver image.
	orig, err := yaml.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var spec corev1.PodTemplateSpec
	switch kind {
	case "StatefulSet":
		var s appsv1.StatefulSet
		if err := yaml.UnmarshalStrict(orig, &s); err != nil {
			return nil, fmt.Errorf("read the StatefulSet: %w", err)
		}
		spec = s.Spec.Template
	default:
		var d appsv1.Deployment
		if err := yaml.UnmarshalStrict(orig, &d); err != nil {
			return nil, fmt.Errorf("read the Deployment: %w", err)
		}
		spec = d.Spec.Template
	}
	var gw corev1.Container
	for _, c := range spec.Spec.Containers {
		if c.Name == gatewayContainer {
			gw = c
		}
	}
	uid := o.UID
	if uid == 0 {
		uid = 1000
		if gw.SecurityContext != nil && gw.SecurityContext.RunAsUser != nil {
			uid = *gw.SecurityContext.RunAsUser
		} else if spec.Spec.SecurityContext != nil && spec.Spec.SecurityContext.RunAsUser != nil {
			uid = *spec.Spec.SecurityContext.RunAsUser
		}
	}
	if uid == 0 {
		return nil, errors.New("the gateway runs as root (runAsUser 0): the driver refuses a socket directory of another uid and the proxy runs as non-root; pass --uid")
	}
	driverImage := o.DriverImage
	if driverImage == "" {
		driverImage = gw.Image
	}
	gatewayID := o.GatewayID
	if gatewayID == "" {
		gatewayID = toml["openshell.drivers.kubernetes"]["gateway_id"]
	}
	if gatewayID == "" {
		gatewayID = "openshell"
	}

	// The patch, adjusted to this workload and these options.
	var p appsv1.StatefulSet
	if err := yaml.UnmarshalStrict(patchYAML, &p); err != nil {
		return nil, fmt.Errorf("gateway-patch.yaml: %w", err)
	}
	ps := &p.Spec.Template.Spec
	ps.SecurityContext.FSGroup = &uid
	for i := range ps.Containers {
		c := &ps.Containers[i]
		if c.SecurityContext != nil {
			c.SecurityContext.RunAsUser, c.SecurityContext.RunAsGroup = &uid, &uid
		}
		switch c.Name {
		case gatewayContainer:
			// The gateway keeps its own securityContext unless it has none.
			if gw.SecurityContext == nil || gw.SecurityContext.RunAsUser == nil {
				nonRoot := true
				c.SecurityContext = &corev1.SecurityContext{RunAsUser: &uid, RunAsNonRoot: &nonRoot}
			}
		case proxyContainer:
			c.Image = o.ProxyImage
			c.Args = proxyArgs(c.Args, gatewayID, o)
			for j := range c.Ports {
				if c.Ports[j].Name == ProxyMetricsPortName {
					c.Ports[j].ContainerPort = o.MetricsPort
				}
			}
		case driverContainer:
			c.Image = driverImage
			c.Env = driverEnv(toml, gatewayID, o.DriverEnv)
		}
	}
	for i := range ps.Volumes {
		if v := &ps.Volumes[i]; v.Secret != nil && v.Name == proxySecret {
			v.Secret.SecretName = o.Secret
		}
	}

	// Only the pod template: the rest of a StatefulSet's spec does not
	// exist in a Deployment.
	patchJSON, err := toJSON(p.Spec.Template)
	if err != nil {
		return nil, err
	}
	patchJSON = []byte(`{"spec":{"template":` + string(patchJSON) + `}}`)
	origJSON, err := yaml.YAMLToJSON(orig)
	if err != nil {
		return nil, err
	}
	var schema any = appsv1.StatefulSet{}
	if kind == "Deployment" {
		schema = appsv1.Deployment{}
	}
	merged, err := strategicpatch.StrategicMergePatch(origJSON, patchJSON, schema)
	if err != nil {
		return nil, fmt.Errorf("strategic merge of gateway-patch.yaml into %s %s: %w", kind, name, err)
	}
	return yaml.JSONToYAML(merged)
}

// toJSON marshals the patch's spec without the zero values a typed struct
// would add (a strategic merge of "replicas: null" would delete it).
func toJSON(v any) ([]byte, error) {
	b, err := yaml.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	prune(m)
	y, err := yaml.Marshal(m)
	if err != nil {
		return nil, err
	}
	return yaml.YAMLToJSON(y)
}

// prune drops the nulls that typed marshalling adds (creationTimestamp:
// null would be a deletion in a strategic merge); empty maps stay (an
// emptyDir: {} is the volume's whole source).
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if x == nil {
				delete(t, k)
				continue
			}
			t[k] = prune(x)
		}
	case []any:
		for i := range t {
			t[i] = prune(t[i])
		}
	}
	return v
}

func proxyArgs(args []string, gatewayID string, o Options) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if i+1 < len(args) {
			switch a {
			case "--gateway", "--gateway-id":
				out, i = append(out, a, gatewayID), i+1
				continue
			case "--collector":
				out, i = append(out, a, o.Collector), i+1
				continue
			case "--metrics-listen":
				out, i = append(out, a, fmt.Sprintf(":%d", o.MetricsPort)), i+1
				continue
			case "--ca":
				if o.Insecure {
					i++
					continue
				}
			}
		}
		out = append(out, a)
	}
	if o.Insecure {
		out = append(out, "--insecure")
	}
	return out
}

func driverEnv(toml map[string]map[string]string, gatewayID string, overrides []string) []corev1.EnvVar {
	env := map[string]string{"OPENSHELL_GATEWAY_ID": gatewayID}
	for _, m := range driverEnvFromTOML {
		if v := toml[m.section][m.key]; v != "" && m.env != "OPENSHELL_GATEWAY_ID" {
			env[m.env] = v
		}
	}
	if env["OPENSHELL_WORKSPACE_MODE"] == "" {
		env["OPENSHELL_WORKSPACE_MODE"] = "shared" // the chart's default
	}
	for _, kv := range overrides {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]corev1.EnvVar, 0, len(keys))
	for _, k := range keys {
		out = append(out, corev1.EnvVar{Name: k, Value: env[k]})
	}
	return out
}
