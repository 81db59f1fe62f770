package agent

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify/registrytest"
)

func TestParseDockerSecret(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	secret := func(typ, key, cfg string) string {
		return fmt.Sprintf(`{"kind":"Secret","type":%q,"data":{%q:%q}}`, typ, key, base64.StdEncoding.EncodeToString([]byte(cfg)))
	}
	cases := []struct {
		name, secret string
		host, user   string // "" host: an error is wanted
	}{
		{"dockerconfigjson, Docker Hub's v1 key", secret("kubernetes.io/dockerconfigjson", ".dockerconfigjson", `{"auths":{"https://index.docker.io/v1/":{"auth":"`+auth+`"}}}`), "index.docker.io", "alice"},
		{"dockerconfigjson, host:port", secret("kubernetes.io/dockerconfigjson", ".dockerconfigjson", `{"auths":{"registry.example:5000":{"username":"alice","password":"s3cret"}}}`), "registry.example:5000", "alice"},
		{"dockercfg, a path after the host", secret("kubernetes.io/dockercfg", ".dockercfg", `{"https://ghcr.io/v2/":{"auth":"`+auth+`"}}`), "ghcr.io", "alice"},
		{"docker.io is Docker Hub", secret("kubernetes.io/dockerconfigjson", ".dockerconfigjson", `{"auths":{"docker.io":{"auth":"`+auth+`"}}}`), "index.docker.io", "alice"},
		{"not a docker config", `{"kind":"Secret","type":"Opaque","data":{"password":"czNjcmV0"}}`, "", ""},
		{"broken JSON inside", secret("kubernetes.io/dockerconfigjson", ".dockerconfigjson", `{"auths":`), "", ""},
	}
	for _, c := range cases {
		got, err := parseDockerSecret([]byte(c.secret))
		switch {
		case c.host == "" && err == nil:
			t.Errorf("%s: no error (%v)", c.name, got)
		case c.host != "" && (err != nil || got[c.host].Username != c.user):
			t.Errorf("%s: %v %+v; want %s for %s", c.name, err, got, c.user, c.host)
		}
	}
}

// TestPullFailureVerifiedWithGrantedSecret: the operator grants the agent
// get on one named pull secret (a Role with resourceNames, as the chart
// writes for verify.pull_secrets) and lists two; the agent reads the one
// it may (the other read is refused and counted) and asks the in-process
// registry, behind token auth, with its credentials: the private
// repository's missing tag is not_found, certain, which an anonymous
// check (401) could not say.
func TestPullFailureVerifiedWithGrantedSecret(t *testing.T) {
	ctx := context.Background()
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	reg := registrytest.New(t)
	reg.Push(t, "private/app:1.0", registrytest.ImageFor(t, "linux", "amd64"))
	image := reg.Host + "/private/app:9.9.9"

	ns := "verify-secret"
	admin := testNamespace(t, ns)
	dockercfg := fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q}}}`, reg.Host, registrytest.User, registrytest.Password)
	for _, name := range []string{"regcred", "not-granted"} {
		if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(dockercfg)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	grantAgent(t, admin, ns, "eventpipe-agent-pull-secrets",
		[]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"regcred"}, Verbs: []string{"get"}}})
	pod := createPod(t, admin, ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}, Containers: []corev1.Container{{Name: "agent", Image: image}}}})

	col := startCollector(t, t.TempDir())
	cfg := testConfig("verifysecret", col.addr())
	cfg.Verify.Enabled, cfg.Verify.PullFailures = true, true
	cfg.Verify.PullSecrets = []SecretRef{{Namespace: ns, Name: "not-granted"}, {Namespace: ns, Name: "regcred"}}
	ra := startAgent(t, cfg)
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) { return ra.a.synced.Load(), "" })

	kubeletEvent(t, admin, pod, "app.1", "Failed", "spec.containers{agent}", accessDenied(image))
	var upd *eventpipev1.Occurrence
	waitFor(t, 60*time.Second, "the registry's update at the collector", func() (bool, string) {
		var seen []string
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && strings.HasPrefix(o.GetEventId(), VerifiedEventIDPrefix) {
				upd = o
				return true, ""
			}
			if o.GetNamespace() == ns {
				seen = append(seen, o.GetPullFailure().GetCategory()+" by "+o.GetPullFailure().GetDecidedBy())
			}
		}
		return false, strings.Join(seen, "; ")
	})
	pf := upd.GetPullFailure()
	if pf.GetCategory() != eventpipev1.CategoryNotFound || pf.GetDecidedBy() != eventpipev1.DecidedByRegistry || pf.GetConfidence() != eventpipev1.ConfidenceCertain ||
		!strings.HasPrefix(pf.GetDetail(), "tag 9.9.9 does not exist in "+reg.Host+"/private/app") {
		t.Errorf("update: %v", pf)
	}
	if n := counter(t, ra.reg, "eventpipe_agent_verify_pull_secret_errors_total", nil); n < 1 {
		t.Errorf("pull secret errors %v, want the refused read of not-granted counted", n)
	}
}
