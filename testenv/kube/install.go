package kube

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/eventpipe/eventpipe/testenv/crds"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// install creates the agent's namespace and service account, applies the
// agent's RBAC manifest, and installs the Agent Sandbox CRDs (the real
// controller's when it runs, else testenv/crds').
func (c *Cluster) install(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AgentNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", AgentNamespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "eventpipe-agent", Namespace: AgentNamespace}}
	if _, err := cs.CoreV1().ServiceAccounts(AgentNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account: %w", err)
	}
	manifest, err := os.ReadFile(c.opts.RBACFile)
	if err != nil {
		return fmt.Errorf("read agent rbac: %w", err)
	}
	if err := ApplyRBAC(ctx, cs, manifest); err != nil {
		return fmt.Errorf("apply %s: %w", c.opts.RBACFile, err)
	}
	if c.opts.Writers.AgentSandbox {
		// The CRDs the controller serves, from its own module version.
		return crds.InstallDir(ctx, c.AdminConfig(), filepath.Join(c.binDir, AgentSandboxCRDDir))
	}
	return crds.Install(ctx, c.AdminConfig())
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// ApplyRBAC creates (or replaces) the ClusterRoles, ClusterRoleBindings,
// Roles and RoleBindings of a multi-document YAML manifest. Any other kind
// is an error, so a manifest change is not silently ignored.
func ApplyRBAC(ctx context.Context, cs kubernetes.Interface, manifest []byte) error {
	for i, doc := range docSep.Split(string(manifest), -1) {
		if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
		var err error
		switch tm.Kind {
		case "ClusterRole":
			var o rbacv1.ClusterRole
			if err = yaml.UnmarshalStrict([]byte(doc), &o); err == nil {
				err = upsert(ctx, &o, cs.RbacV1().ClusterRoles().Create, cs.RbacV1().ClusterRoles().Update, cs.RbacV1().ClusterRoles().Get)
			}
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			if err = yaml.UnmarshalStrict([]byte(doc), &o); err == nil {
				err = upsert(ctx, &o, cs.RbacV1().ClusterRoleBindings().Create, cs.RbacV1().ClusterRoleBindings().Update, cs.RbacV1().ClusterRoleBindings().Get)
			}
		case "Role":
			var o rbacv1.Role
			if err = yaml.UnmarshalStrict([]byte(doc), &o); err == nil {
				c := cs.RbacV1().Roles(o.Namespace)
				err = upsert(ctx, &o, c.Create, c.Update, c.Get)
			}
		case "RoleBinding":
			var o rbacv1.RoleBinding
			if err = yaml.UnmarshalStrict([]byte(doc), &o); err == nil {
				c := cs.RbacV1().RoleBindings(o.Namespace)
				err = upsert(ctx, &o, c.Create, c.Update, c.Get)
			}
		default:
			err = fmt.Errorf("unsupported kind %q", tm.Kind)
		}
		if err != nil {
			return fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
	}
	return nil
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

type object interface {
	metav1.Object
}

func upsert[T object](ctx context.Context, o T,
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	get func(context.Context, string, metav1.GetOptions) (T, error),
) error {
	_, err := create(ctx, o, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := get(ctx, o.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	o.SetResourceVersion(cur.GetResourceVersion())
	_, err = update(ctx, o, metav1.UpdateOptions{})
	return err
}
