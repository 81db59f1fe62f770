package check

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestHelmInstallKeepsTokens installs the chart (default values) into the
// real kube-apiserver with helm, upgrades it and uninstalls it: the token
// Secret is generated at install, the same after the upgrade (lookup), and
// still there after the uninstall (helm.sh/resource-policy keep), so agents
// and readers keep their credentials. (There is no scheduler: the pods are
// never run, the objects are real.)
func TestHelmInstallKeepsTokens(t *testing.T) {
	needCluster(t)
	ctx := ctxT(t, 5*time.Minute)
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns, release = "eventpipe-install", "ep"
	helm := func(args ...string) {
		t.Helper()
		if out, err := HelmKube(ctx, root, cluster.Kubeconfig(), append(args, "--namespace", ns)...); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	tokens := func() map[string][]byte {
		t.Helper()
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, release+"-eventpipe-tokens", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("tokens Secret: %v", err)
		}
		return s.Data
	}
	// A wrong value fails the install itself, before anything is created.
	out, err := HelmKube(ctx, root, cluster.Kubeconfig(), "install", "bad", ChartDir(root), "--namespace", ns, "--create-namespace", "--set", "collector.config.grpc.shutdown_grace=20")
	if err == nil || !strings.Contains(err.Error(), "/collector/config/grpc/shutdown_grace") {
		t.Errorf("helm install with a duration without unit: %v\n%s", err, out)
	}
	helm("install", release, ChartDir(root), "--create-namespace", "--set", "cluster=install-test", "--set", "auth.readers[0].name=team-a", "--set", "auth.readers[0].workspaces[0]=team-a")
	first := tokens()
	for _, k := range []string{"agent.token", "reader-team-a.token", "tokens.yaml"} {
		if len(first[k]) == 0 {
			t.Errorf("generated Secret has no %s", k)
		}
	}
	if !strings.Contains(string(first["tokens.yaml"]), string(first["agent.token"])) || !strings.Contains(string(first["tokens.yaml"]), string(first["reader-team-a.token"])) {
		t.Errorf("tokens.yaml does not hold the agent's and the reader's tokens")
	}
	helm("upgrade", release, ChartDir(root), "--set", "cluster=install-test-2", "--set", "auth.readers[0].name=team-a", "--set", "auth.readers[0].workspaces[0]=team-a")
	second := tokens()
	for _, k := range []string{"agent.token", "reader-team-a.token"} {
		if string(second[k]) != string(first[k]) {
			t.Errorf("upgrade changed %s of the tokens Secret", k)
		}
	}
	// The tokens file follows the values (the agent's cluster), with the same tokens.
	if tf := string(second["tokens.yaml"]); !strings.Contains(tf, "install-test-2") || !strings.Contains(tf, string(first["agent.token"])) {
		t.Errorf("tokens.yaml after the upgrade:\n%s", tf)
	}
	dep, err := cs.AppsV1().Deployments(ns).Get(ctx, release+"-eventpipe-agent", metav1.GetOptions{})
	if err != nil || *dep.Spec.Replicas != 2 {
		t.Errorf("agent Deployment after upgrade: %v", err)
	}
	helm("uninstall", release, "--wait=false")
	if got := tokens(); string(got["agent.token"]) != string(first["agent.token"]) {
		t.Errorf("the tokens Secret changed or went away on uninstall")
	}
	if _, err := cs.AppsV1().Deployments(ns).Get(ctx, release+"-eventpipe-agent", metav1.GetOptions{}); err == nil {
		t.Errorf("the agent Deployment survived the uninstall")
	}
}
