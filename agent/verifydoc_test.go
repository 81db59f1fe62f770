package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVerifyConfigDocParses: the verify: reference in docs/operations.md
// is a config the agent accepts as printed.
func TestVerifyConfigDocParses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "### Registry checks (`verify:`, agent)")
	if i < 0 {
		t.Fatal("docs/operations.md has no verify: section")
	}
	start := strings.Index(doc[i:], "```yaml\n")
	end := strings.Index(doc[i+start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("no yaml block in the verify: section")
	}
	block := doc[i+start+8 : i+start+8+end]
	cfg, err := ParseConfig([]byte("cluster: prod-eu-1\ncollector:\n  address: collector:7070\n" + block))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !cfg.Verify.Enabled || !cfg.Verify.PullFailures || cfg.Verify.Supervisor.Name != "openshell" || cfg.Verify.Registry.CacheTTL.Minutes() != 10 {
		t.Errorf("decoded %+v", cfg.Verify)
	}
}
