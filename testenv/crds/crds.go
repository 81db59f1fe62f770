package crds

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

//go:embed *.yaml
var files embed.FS

// Group is the Agent Sandbox API group.
const Group = "agents.x-k8s.io"

var (
	// SandboxV1beta1 is the preferred (storage) version of Sandbox.
	SandboxV1beta1 = schema.GroupVersionResource{Group: Group, Version: "v1beta1", Resource: "sandboxes"}
	// SandboxV1alpha1 is the older served version of Sandbox.
	SandboxV1alpha1 = schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: "sandboxes"}
	crdGVR          = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// Objects returns the embedded CRDs, decoded.
func Objects() ([]*unstructured.Unstructured, error) { return objectsFrom(files) }

func objectsFrom(fsys fs.FS) ([]*unstructured.Unstructured, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list embedded crds: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("decode %s: %w", name, err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	if len(out) == 0 {
		return nil, errors.New("no *.yaml CRD files")
	}
	return out, nil
}

// Install creates (or updates) the CRDs through cfg (which needs permission
// to write customresourcedefinitions) and waits until they serve.
func Install(ctx context.Context, cfg *rest.Config) error { return install(ctx, cfg, files) }

// InstallDir is Install for the CRD files (*.yaml) of a directory instead
// of the embedded ones: the Agent Sandbox module's own CRDs, which
// testenv/build/build.sh copies beside the controller it builds from the
// same module version.
func InstallDir(ctx context.Context, cfg *rest.Config, dir string) error {
	if err := install(ctx, cfg, os.DirFS(dir)); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	return nil
}

func install(ctx context.Context, cfg *rest.Config, fsys fs.FS) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("install crds: %w", err)
	}
	objs, err := objectsFrom(fsys)
	if err != nil {
		return fmt.Errorf("install crds: %w", err)
	}
	for _, obj := range objs {
		if err := apply(ctx, dc, obj); err != nil {
			return err
		}
	}
	for _, obj := range objs {
		if err := waitServed(ctx, dc, obj); err != nil {
			return err
		}
	}
	return nil
}

func apply(ctx context.Context, dc dynamic.Interface, obj *unstructured.Unstructured) error {
	crds := dc.Resource(crdGVR)
	_, err := crds.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := crds.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("get crd %s: %w", obj.GetName(), gerr)
		}
		obj = obj.DeepCopy()
		obj.SetResourceVersion(cur.GetResourceVersion())
		_, err = crds.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("apply crd %s: %w", obj.GetName(), err)
	}
	return nil
}

func waitServed(ctx context.Context, dc dynamic.Interface, obj *unstructured.Unstructured) error {
	name := obj.GetName()
	group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(obj.Object, "spec", "versions")
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		last = servedOnce(ctx, dc, name, group, plural, versions)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for crd %s: %w (last: %v)", name, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func servedOnce(ctx context.Context, dc dynamic.Interface, name, group, plural string, versions []any) error {
	cur, err := dc.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
	established := false
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			established = true
		}
	}
	if !established {
		return errors.New("not Established yet")
	}
	for _, v := range versions {
		m, _ := v.(map[string]any)
		vname, _ := m["name"].(string)
		if served, _ := m["served"].(bool); !served {
			continue
		}
		gvr := schema.GroupVersionResource{Group: group, Version: vname, Resource: plural}
		if _, err := dc.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return fmt.Errorf("list %s: %w", gvr, err)
		}
	}
	return nil
}
