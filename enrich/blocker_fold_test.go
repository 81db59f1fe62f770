package enrich

import "testing"

// indexFold agrees with a plain folded scan, cases and edges included.
func TestIndexFold(t *testing.T) {
	ref := func(s, sub string) int {
		for i := 0; i+len(sub) <= len(s); i++ {
			if hasPrefixFold(s[i:], sub) {
				return i
			}
		}
		return -1
	}
	texts := []string{"", "a", "A", "aA", "Insufficient cpu", "0/3 nodes: 3 INSUFFICIENT memory, insufficient cpu",
		`StorageClass "gp2" storageclass.storage.k8s.io "x"`, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx Taint", "n.kubernetes.io/ node.kubernetes.io/x",
		"\xff\xfeé taint", "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }"}
	subs := []string{"a", "insufficient", "taint", "storageclass \"", `StorageClass "`, "node.kubernetes.io/", "0/", "é", "x taint", "zz", "}"}
	for _, s := range texts {
		for _, sub := range subs {
			if got, want := indexFold(s, sub), ref(s, sub); got != want {
				t.Errorf("indexFold(%q, %q) = %d, want %d", s, sub, got, want)
			}
		}
		for i := 0; i <= len(s); i++ {
			for j := i; j <= len(s) && j-i <= 6; j++ {
				if sub := s[i:j]; indexFold(s, sub) != ref(s, sub) {
					t.Errorf("indexFold(%q, %q) = %d, want %d", s, sub, indexFold(s, sub), ref(s, sub))
				}
			}
		}
	}
}
