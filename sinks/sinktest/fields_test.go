package sinktest

import (
	"fmt"
	"strings"
	"testing"
)

// TestEveryFieldSetsDistinctValues: EveryField sets distinct values, so a
// value an encoder test finds at a place cannot belong to another field.
func TestEveryFieldSetsDistinctValues(t *testing.T) {
	_, leaves, err := EveryField()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, l := range leaves {
		if _, isBool := l.Value.(bool); isBool {
			continue
		}
		k := fmt.Sprint(l.Value)
		if other, dup := seen[k]; dup {
			t.Errorf("%s and %s both hold %s", other, l.Path, k)
		}
		seen[k] = l.Path
		if strings.TrimSpace(k) == "" {
			t.Errorf("%s is empty", l.Path)
		}
	}
}
