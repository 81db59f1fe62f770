package agent

import (
	"errors"
	"strings"
	"testing"
)

// gatewayTOML is what OpenShell's chart renders into the gateway's
// ConfigMap (<release>-config, key gateway.toml) with
// supervisor.image.tag overridden.
const gatewayTOML = `[openshell]

[openshell.gateway]
bind_address          = "0.0.0.0:8080"
log_level             = "info"
default_image         = "ghcr.io/nvidia/openshell-community/sandboxes/base:latest"
supervisor_image      = "ghcr.io/nvidia/openshell/supervisor:0.0.36"

[openshell.drivers.kubernetes]
workspace_mode               = "shared"
gateway_id                   = "gw-east"
# supervisor_image = "not this: a comment"
labels = { "a" = "b" }
`

func statefulSet(container string) string {
	return `{"kind":"StatefulSet","metadata":{"name":"openshell","namespace":"openshell","uid":"u-1"},
"spec":{"template":{"spec":{"containers":[` + container + `],
"volumes":[{"name":"gateway-config","configMap":{"name":"openshell-config"}}]}}}}`
}

func TestResolveSupervisor(t *testing.T) {
	cms := map[string]map[string]string{
		"openshell-config": {"gateway.toml": gatewayTOML},
		"driver-only":      {"gateway.toml": "[openshell.drivers.kubernetes]\nsupervisor_image = 'reg.example/sup:1.2'\n[openshell.gateway]\nsupervisor_image = \"ignored:1\"\n"},
		"sup-env":          {"image": "reg.example/from-cm:3"},
	}
	get := func(name string) (map[string]string, error) {
		if d, ok := cms[name]; ok {
			return d, nil
		}
		return nil, errors.New("configmaps \"" + name + "\" not found")
	}
	mount := `"volumeMounts":[{"name":"gateway-config","mountPath":"/etc/openshell"}]`
	cases := []struct {
		name, workload, image, source, gatewayID, err string
	}{
		{name: "env wins over the TOML file",
			workload: statefulSet(`{"name":"openshell-gateway","image":"ghcr.io/nvidia/openshell/gateway:0.0.36","args":["--config","/etc/openshell/gateway.toml"],
"env":[{"name":"OPENSHELL_SUPERVISOR_IMAGE","value":"ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"}],` + mount + `}`),
			image: "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist", source: supervisorFromEnv},
		{name: "env from a ConfigMap key",
			workload: statefulSet(`{"name":"openshell-gateway","image":"gw:1","env":[{"name":"OPENSHELL_SUPERVISOR_IMAGE","valueFrom":{"configMapKeyRef":{"name":"sup-env","key":"image"}}}]}`),
			image:    "reg.example/from-cm:3", source: supervisorFromEnv},
		{name: "gateway.toml [openshell.gateway] (the chart's override)",
			workload: statefulSet(`{"name":"openshell-gateway","image":"ghcr.io/nvidia/openshell/gateway:0.0.36","args":["--config","/etc/openshell/gateway.toml","--db-url","sqlite:/x"],` + mount + `}`),
			image:    "ghcr.io/nvidia/openshell/supervisor:0.0.36", source: supervisorFromGateway, gatewayID: "gw-east"},
		{name: "driver table wins, subPath mount, --config=",
			workload: `{"kind":"Deployment","metadata":{"name":"gw","namespace":"os"},"spec":{"template":{"spec":{"containers":[{"name":"openshell-gateway","image":"gw:1",
"args":["--config=/etc/gw.toml"],"volumeMounts":[{"name":"c","mountPath":"/etc/gw.toml","subPath":"gateway.toml"}]}],
"volumes":[{"name":"c","configMap":{"name":"driver-only"}}]}}}}`,
			image: "reg.example/sup:1.2", source: supervisorFromDriver},
		{name: "no setting: the default pinned to the gateway's version",
			workload: statefulSet(`{"name":"openshell-gateway","image":"ghcr.io/nvidia/openshell/gateway:0.0.36"}`),
			image:    "ghcr.io/nvidia/openshell/supervisor:0.0.36", source: supervisorFromDefault},
		{name: "the gateway container is picked by name",
			workload: statefulSet(`{"name":"sidecar","image":"proxy:9"},{"name":"openshell-gateway","image":"ghcr.io/nvidia/openshell/gateway:1.0.0+build.7"}`),
			image:    "ghcr.io/nvidia/openshell/supervisor:1.0.0-build.7", source: supervisorFromDefault},
		{name: "a gateway image by digest names no version",
			workload: statefulSet(`{"name":"openshell-gateway","image":"ghcr.io/nvidia/openshell/gateway@sha256:` + strings.Repeat("a", 64) + `"}`),
			err:      "names no version"},
		{name: "the ConfigMap cannot be read",
			workload: `{"kind":"StatefulSet","metadata":{"name":"g","namespace":"n"},"spec":{"template":{"spec":{"containers":[{"name":"openshell-gateway","image":"gw:1",
"args":["--config","/etc/openshell/gateway.toml"],` + mount + `}],"volumes":[{"name":"gateway-config","configMap":{"name":"gone"}}]}}}}`,
			err: `ConfigMap gone: configmaps "gone" not found`},
		{name: "not JSON", workload: "{", err: "decode gateway workload"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := resolveSupervisor([]byte(c.workload), "openshell-gateway", get)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Image != c.image || got.Source != c.source || got.GatewayID != c.gatewayID {
				t.Errorf("got %q from %q (gateway %q), want %q from %q (gateway %q)", got.Image, got.Source, got.GatewayID, c.image, c.source, c.gatewayID)
			}
		})
	}
}
