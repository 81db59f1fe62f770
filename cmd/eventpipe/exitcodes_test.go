package main

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestExitCodeTableDocumented: docs/cli.md's exit-status table lists
// exactly the statuses the code defines, with the same numbers and names.
func TestExitCodeTableDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile(`(?m)^\| (\d+) \| ([a-z-]+) \|`).FindAllSubmatch(doc, -1)
	documented := map[int]string{}
	for _, r := range rows {
		n, _ := strconv.Atoi(string(r[1]))
		documented[n] = string(r[2])
	}
	for _, c := range exitCodes {
		if got, ok := documented[c.code]; !ok || got != c.name {
			t.Errorf("status %d (%s): docs/cli.md says %q", c.code, c.name, got)
		}
		delete(documented, c.code)
	}
	for n, name := range documented {
		t.Errorf("docs/cli.md documents status %d (%s), which the code does not define", n, name)
	}
	if len(rows) == 0 {
		t.Fatal("no exit-status table found in docs/cli.md")
	}
}
