package check

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestPullSecretRBAC: agent.config.verify.pull_secrets grants get on
// exactly the listed Secrets, one Role per namespace bound to the agent's
// service account, and nothing else; without it (the default) the chart
// grants no access to any Secret.
func TestPullSecretRBAC(t *testing.T) {
	secretRules := func(docs []Doc) map[string][]rbacv1.PolicyRule {
		t.Helper()
		out := map[string][]rbacv1.PolicyRule{}
		for _, d := range docs {
			if d.Kind != "Role" && d.Kind != "ClusterRole" {
				continue
			}
			var r rbacv1.Role
			if err := yaml.Unmarshal(d.YAML, &r); err != nil {
				t.Fatalf("%s: %v", d.ID(), err)
			}
			for _, rule := range r.Rules {
				for _, res := range rule.Resources {
					if res == "secrets" || res == "*" {
						out[d.ID()] = append(out[d.ID()], rule)
					}
				}
			}
		}
		return out
	}
	if got := secretRules(renderSet(t, nil)); len(got) != 0 {
		t.Errorf("the default chart grants Secrets: %v", got)
	}

	values := filepath.Join(t.TempDir(), "pull-secrets.yaml")
	if err := os.WriteFile(values, []byte(`agent:
  config:
    verify:
      enabled: true
      pull_failures: true
      pull_secrets:
        - {namespace: team-a, name: regcred}
        - {namespace: team-a, name: mirror}
        - {namespace: team-b, name: regcred}
        - {namespace: team-a, name: regcred}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	docs := renderSet(t, []string{values})
	want := map[string][]rbacv1.PolicyRule{
		"Role/team-a/eventpipe-agent-pull-secrets": {{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"regcred", "mirror"}, Verbs: []string{"get"}}},
		"Role/team-b/eventpipe-agent-pull-secrets": {{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"regcred"}, Verbs: []string{"get"}}},
	}
	if got := secretRules(docs); !reflect.DeepEqual(got, want) {
		t.Errorf("Secret rules:\n got %+v\nwant %+v", got, want)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		var found bool
		for _, d := range docs {
			if d.Kind != "RoleBinding" || d.Namespace != ns || d.Name != "eventpipe-agent-pull-secrets" {
				continue
			}
			var rb rbacv1.RoleBinding
			if err := yaml.Unmarshal(d.YAML, &rb); err != nil {
				t.Fatal(err)
			}
			found = rb.RoleRef.Kind == "Role" && rb.RoleRef.Name == "eventpipe-agent-pull-secrets" && len(rb.Subjects) == 1 &&
				rb.Subjects[0].Kind == "ServiceAccount" && rb.Subjects[0].Name == "eventpipe-agent" && rb.Subjects[0].Namespace == "eventpipe"
		}
		if !found {
			t.Errorf("no RoleBinding of the agent's service account to the pull-secrets Role in %s", ns)
		}
	}
}
