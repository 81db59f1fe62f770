package check

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// kubeconform's schemas cannot be downloaded here; they are generated from
// the API server the tests start (its /openapi/v2, which includes the CRDs
// installed from testdata/crds), the way openapi2jsonschema does: one
// standalone JSON schema per kind and version, strict (additionalProperties
// false wherever the API declares properties), IntOrString and Quantity as
// string-or-number.

// SchemaFileName is kubeconform's default file name for a kind:
// {{ .ResourceKind }}{{ .KindSuffix }}.json, e.g. deployment-apps-v1.json,
// service-v1.json, servicemonitor-monitoring-v1.json.
func SchemaFileName(apiVersion, kind string) string {
	group, version, ok := strings.Cut(apiVersion, "/")
	suffix := "-" + strings.ToLower(strings.Split(group, ".")[0])
	if ok {
		suffix += "-" + strings.ToLower(version)
	}
	return strings.ToLower(kind) + suffix + ".json"
}

// OpenAPIv2 reads the API server's /openapi/v2 document.
func OpenAPIv2(ctx context.Context, cfg *rest.Config) (map[string]any, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	raw, err := dc.RESTClient().Get().AbsPath("/openapi/v2").SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		return nil, fmt.Errorf("read /openapi/v2: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("decode /openapi/v2: %w", err)
	}
	return doc, nil
}

// WriteSchemas writes a strict schema for every kind (apiVersion, kind) the
// OpenAPI document defines and want selects into dir, and returns the file
// names written.
func WriteSchemas(openapi map[string]any, dir string, want func(apiVersion, kind string) bool) ([]string, error) {
	defs, _ := openapi["definitions"].(map[string]any)
	if len(defs) == 0 {
		return nil, fmt.Errorf("openapi document has no definitions")
	}
	for name, d := range defs {
		switch {
		case strings.HasSuffix(name, ".util.intstr.IntOrString"):
			defs[name] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		case strings.HasSuffix(name, ".api.resource.Quantity"):
			defs[name] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
		default:
			strict(d)
		}
	}
	var written []string
	names := make([]string, 0, len(defs))
	for n := range defs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		d, _ := defs[name].(map[string]any)
		gvks, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			apiVersion := version
			if group != "" {
				apiVersion = group + "/" + version
			}
			if !want(apiVersion, kind) {
				continue
			}
			schema := map[string]any{}
			for k, v := range d {
				schema[k] = v
			}
			schema["$schema"] = "http://json-schema.org/draft-07/schema#"
			schema["definitions"] = reachable(defs, d)
			b, err := json.Marshal(schema)
			if err != nil {
				return nil, err
			}
			fn := SchemaFileName(apiVersion, kind)
			if err := os.WriteFile(filepath.Join(dir, fn), b, 0o644); err != nil {
				return nil, err
			}
			written = append(written, fn)
		}
	}
	return written, nil
}

// strict sets additionalProperties false on every object schema with
// properties that does not allow unknown fields itself.
func strict(v any) {
	switch n := v.(type) {
	case map[string]any:
		if _, ok := n["properties"]; ok {
			if _, set := n["additionalProperties"]; !set && n["x-kubernetes-preserve-unknown-fields"] != true {
				n["additionalProperties"] = false
			}
		}
		for _, c := range n {
			strict(c)
		}
	case []any:
		for _, c := range n {
			strict(c)
		}
	}
}

// reachable returns the definitions root refers to, directly or not.
func reachable(defs map[string]any, root any) map[string]any {
	out := map[string]any{}
	var walk func(v any)
	walk = func(v any) {
		switch n := v.(type) {
		case map[string]any:
			if ref, ok := n["$ref"].(string); ok {
				name := strings.TrimPrefix(ref, "#/definitions/")
				if _, seen := out[name]; !seen {
					if d, ok := defs[name]; ok {
						out[name] = d
						walk(d)
					}
				}
			}
			for _, c := range n {
				walk(c)
			}
		case []any:
			for _, c := range n {
				walk(c)
			}
		}
	}
	walk(root)
	return out
}
