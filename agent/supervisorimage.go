package agent

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// The OpenShell gateway's supervisor image, as its Deployment or
// StatefulSet configures it. OpenShell's precedence (RFC 0003: command
// line > environment > TOML file > built-in default) is followed:
//
//  1. env OPENSHELL_SUPERVISOR_IMAGE of the gateway container (charts
//     before the TOML file, 2026-05, set it; operators still may);
//  2. supervisor_image in the gateway's TOML file (--config PATH or env
//     OPENSHELL_GATEWAY_CONFIG), read from the ConfigMap mounted there:
//     [openshell.drivers.kubernetes] wins over [openshell.gateway], which
//     the drivers inherit (the chart writes it there only when
//     supervisor.image.repository or .tag are overridden);
//  3. otherwise the built-in default ghcr.io/nvidia/openshell/supervisor
//     with the gateway's own version as the tag: the chart tags the
//     gateway image with that version, so the gateway image's tag is used
//     (a digest or a moving tag such as latest says nothing: unresolved).

const (
	envSupervisorImage   = "OPENSHELL_SUPERVISOR_IMAGE"
	envGatewayConfig     = "OPENSHELL_GATEWAY_CONFIG"
	defaultSupervisorRep = "ghcr.io/nvidia/openshell/supervisor"
)

// Sources of a resolved supervisor image (the log and the occurrence say which).
const (
	supervisorFromEnv     = "env " + envSupervisorImage
	supervisorFromDriver  = "gateway.toml [openshell.drivers.kubernetes] supervisor_image"
	supervisorFromGateway = "gateway.toml [openshell.gateway] supervisor_image"
	supervisorFromDefault = "the gateway's built-in default (its version from the gateway image tag)"
)

// supervisorImage is what resolveSupervisor found.
type supervisorImage struct {
	Image  string
	Source string
	// GatewayID from the TOML file's [openshell.drivers.kubernetes]
	// gateway_id, when it says.
	GatewayID string
	// Workload identity, for the occurrence.
	Kind, Namespace, Name, UID string
}

// workload is the part of a Deployment or StatefulSet read here.
type workload struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				Containers []container `json:"containers"`
				Volumes    []volume    `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

type container struct {
	Name    string   `json:"name"`
	Image   string   `json:"image"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
	Env     []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			ConfigMapKeyRef *struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"configMapKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
		SubPath   string `json:"subPath"`
	} `json:"volumeMounts"`
}

type volume struct {
	Name      string `json:"name"`
	ConfigMap *struct {
		Name  string `json:"name"`
		Items []struct {
			Key  string `json:"key"`
			Path string `json:"path"`
		} `json:"items"`
	} `json:"configMap"`
}

// configMapGetter returns a ConfigMap's data (namespace of the workload).
type configMapGetter func(name string) (map[string]string, error)

// resolveSupervisor reads the supervisor image from a gateway workload's
// JSON. containerName picks the gateway container ("" or absent: the first).
func resolveSupervisor(raw []byte, containerName string, getCM configMapGetter) (supervisorImage, error) {
	var w workload
	if err := json.Unmarshal(raw, &w); err != nil {
		return supervisorImage{}, fmt.Errorf("decode gateway workload: %w", err)
	}
	out := supervisorImage{Kind: w.Kind, Namespace: w.Metadata.Namespace, Name: w.Metadata.Name, UID: w.Metadata.UID}
	cs := w.Spec.Template.Spec.Containers
	if len(cs) == 0 {
		return out, fmt.Errorf("%s %s/%s has no containers", w.Kind, out.Namespace, out.Name)
	}
	c := &cs[0]
	for i := range cs {
		if cs[i].Name == containerName {
			c = &cs[i]
		}
	}
	configPath := ""
	for _, e := range c.Env {
		switch e.Name {
		case envSupervisorImage:
			v := e.Value
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				data, err := getCM(e.ValueFrom.ConfigMapKeyRef.Name)
				if err != nil {
					return out, fmt.Errorf("read %s from ConfigMap %s: %w", envSupervisorImage, e.ValueFrom.ConfigMapKeyRef.Name, err)
				}
				v = data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
			if v = strings.TrimSpace(v); v != "" {
				out.Image, out.Source = v, supervisorFromEnv
				return out, nil
			}
		case envGatewayConfig:
			configPath = e.Value
		}
	}
	args := append(append([]string{}, c.Command...), c.Args...)
	for i, a := range args {
		if a == "--config" && i+1 < len(args) {
			configPath = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = v
		}
	}
	if configPath != "" {
		toml, err := readMountedFile(w, c, configPath, getCM)
		if err != nil {
			return out, err
		}
		if toml != "" {
			tables := parseTOMLStrings(toml)
			out.GatewayID = tables["openshell.drivers.kubernetes"]["gateway_id"]
			if v := tables["openshell.drivers.kubernetes"]["supervisor_image"]; v != "" {
				out.Image, out.Source = v, supervisorFromDriver
				return out, nil
			}
			if v := tables["openshell.gateway"]["supervisor_image"]; v != "" {
				out.Image, out.Source = v, supervisorFromGateway
				return out, nil
			}
		}
	}
	tag := imageTag(c.Image)
	if tag == "" || tag == "latest" {
		return out, fmt.Errorf("container %s of %s %s/%s sets no supervisor image and its image %q names no version: the gateway's built-in default cannot be told", c.Name, w.Kind, out.Namespace, out.Name, c.Image)
	}
	if tag == "0.0.0" {
		tag = "dev" // OpenShell's resolve_supervisor_image_tag
	}
	out.Image, out.Source = defaultSupervisorRep+":"+strings.ReplaceAll(tag, "+", "-"), supervisorFromDefault
	return out, nil
}

// readMountedFile returns the content of file p as the container sees it
// when it comes from a ConfigMap volume; "" when it does not.
func readMountedFile(w workload, c *container, p string, getCM configMapGetter) (string, error) {
	for _, m := range c.VolumeMounts {
		key := ""
		switch {
		case m.SubPath != "" && path.Clean(m.MountPath) == path.Clean(p):
			key = m.SubPath
		case m.SubPath == "" && strings.HasPrefix(path.Clean(p), path.Clean(m.MountPath)+"/"):
			key = strings.TrimPrefix(path.Clean(p), path.Clean(m.MountPath)+"/")
		default:
			continue
		}
		for _, v := range w.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if it.Path == key {
					key = it.Key
				}
			}
			data, err := getCM(v.ConfigMap.Name)
			if err != nil {
				return "", fmt.Errorf("read gateway config %s from ConfigMap %s: %w", p, v.ConfigMap.Name, err)
			}
			return data[key], nil
		}
	}
	return "", nil
}

// imageTag is the tag of an image reference ("" for a digest or none).
func imageTag(ref string) string {
	if strings.Contains(ref, "@") {
		return ""
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return ""
}

// parseTOMLStrings reads the string values of a TOML document by table:
// [table] headers and key = "basic string" or 'literal string' lines.
// That is all the gateway's supervisor_image and gateway_id need; arrays,
// inline tables and multi-line strings are skipped, not misread.
func parseTOMLStrings(doc string) map[string]map[string]string {
	out := map[string]map[string]string{}
	table := ""
	for _, line := range strings.Split(doc, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if strings.HasPrefix(line, "[") && !strings.HasPrefix(line, "[[") {
			if end := strings.Index(line, "]"); end > 0 {
				table = strings.TrimSpace(line[1:end])
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k, v = strings.Trim(strings.TrimSpace(k), `"`), strings.TrimSpace(v)
		var s string
		switch {
		case strings.HasPrefix(v, `"""`) || strings.HasPrefix(v, `'''`):
			continue
		case strings.HasPrefix(v, `"`):
			end := closingQuote(v)
			if end < 0 {
				continue
			}
			u, err := strconv.Unquote(v[:end+1])
			if err != nil {
				continue
			}
			s = u
		case strings.HasPrefix(v, `'`):
			end := strings.Index(v[1:], `'`)
			if end < 0 {
				continue
			}
			s = v[1 : end+1]
		default:
			continue
		}
		if out[table] == nil {
			out[table] = map[string]string{}
		}
		out[table][k] = s
	}
	return out
}

// closingQuote is the index of the quote that ends the basic string v starts.
func closingQuote(v string) int {
	for i := 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}
