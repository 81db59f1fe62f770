package check

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// RepoRoot is the directory of the main module's go.mod (the repository
// root), found by walking up from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/eventpipe/eventpipe\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root (go.mod of github.com/eventpipe/eventpipe) not found above the working directory")
		}
		dir = parent
	}
}

// BinDir holds helm and kubeconform: $EVENTPIPE_BIN_DIR, else <root>/.bin.
func BinDir(root string) string {
	if d := os.Getenv("EVENTPIPE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(root, ".bin")
}

// Tool returns the path of a tool: $<NAME> (upper case) when set, else
// BinDir/name. It fails when the file is missing (make chart-tools builds it).
func Tool(root, name string) (string, error) {
	p := os.Getenv(strings.ToUpper(name))
	if p == "" {
		p = filepath.Join(BinDir(root), name)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found (%v): run `make chart-tools`", name, err)
	}
	return p, nil
}

// ChartDir is the chart's directory.
func ChartDir(root string) string { return filepath.Join(root, "deploy", "helm", "eventpipe") }

// Helm runs helm with its config, cache and data homes in a temporary
// directory (nothing is read from or written to the user's helm setup).
func Helm(ctx context.Context, root string, args ...string) ([]byte, error) {
	return HelmKube(ctx, root, "", args...)
}

// HelmKube is Helm talking to the cluster of kubeconfig ("" : none).
func HelmKube(ctx context.Context, root, kubeconfig string, args ...string) ([]byte, error) {
	bin, err := Tool(root, "helm")
	if err != nil {
		return nil, err
	}
	home, err := os.MkdirTemp("", "eventpipe-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+kubeconfig)
	if kubeconfig == "" {
		cmd.Env[len(cmd.Env)-1] = "KUBECONFIG=" + filepath.Join(home, "no-kubeconfig")
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Render runs `helm template RELEASE CHART --namespace NS` with the given
// values files and --set values, and splits the output into documents.
func Render(ctx context.Context, root, release, namespace string, valuesFiles []string, set []string, showOnly ...string) ([]Doc, error) {
	return renderChart(ctx, root, release, namespace, valuesFiles, set, false, showOnly)
}

// RenderPlaceholder is Render without values.schema.json, for the raw
// manifests' values only: their cluster CHANGE-ME is a placeholder the
// schema refuses (as the binaries do) until the operator names the cluster.
// TestManifestValuesOnlyPlaceholderRefused shows the schema refuses nothing
// else in them.
func RenderPlaceholder(ctx context.Context, root, release, namespace string, valuesFiles []string, set []string, showOnly ...string) ([]Doc, error) {
	return renderChart(ctx, root, release, namespace, valuesFiles, set, true, showOnly)
}

func renderChart(ctx context.Context, root, release, namespace string, valuesFiles []string, set []string, skipSchema bool, showOnly []string) ([]Doc, error) {
	args := []string{"template", release, ChartDir(root), "--namespace", namespace}
	if skipSchema {
		args = append(args, "--skip-schema-validation")
	}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	for _, s := range showOnly {
		args = append(args, "--show-only", s)
	}
	out, err := Helm(ctx, root, args...)
	if err != nil {
		return nil, err
	}
	return SplitDocs(out)
}

// Doc is one rendered Kubernetes object.
type Doc struct {
	Source     string // templates/... file it came from
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	YAML       []byte // the document without the "# Source:" line
	Object     map[string]any
}

// ID is kind/namespace/name.
func (d Doc) ID() string { return d.Kind + "/" + d.Namespace + "/" + d.Name }

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// SplitDocs splits helm's output into its non-empty documents.
func SplitDocs(out []byte) ([]Doc, error) {
	var docs []Doc
	for _, part := range docSep.Split(string(out), -1) {
		var src string
		var kept []string
		for _, l := range strings.Split(part, "\n") {
			if s, ok := strings.CutPrefix(l, "# Source: "); ok {
				src = s
				continue
			}
			kept = append(kept, l)
		}
		body := strings.TrimSpace(strings.Join(kept, "\n"))
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(body), &obj); err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		if len(obj) == 0 {
			continue
		}
		d := Doc{Source: src, YAML: []byte(body + "\n"), Object: obj}
		d.APIVersion, _ = obj["apiVersion"].(string)
		d.Kind, _ = obj["kind"].(string)
		if md, ok := obj["metadata"].(map[string]any); ok {
			d.Name, _ = md["name"].(string)
			d.Namespace, _ = md["namespace"].(string)
		}
		if d.Kind == "" || d.APIVersion == "" || d.Name == "" {
			return nil, fmt.Errorf("%s: a document without apiVersion, kind or metadata.name", src)
		}
		docs = append(docs, d)
	}
	return docs, nil
}
