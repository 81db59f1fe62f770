package enrich

import (
	"slices"
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/remedy"
)

// vocabEntry is one line of testdata/pullvocab/vocab.jsonl: an error
// wording a runtime or registry emits into a pull failure, with an Event
// message composed from it (see testdata/pullvocab/README.md).
type vocabEntry struct {
	Runtime   string `json:"runtime"`
	Versions  string `json:"versions"`
	Source    string `json:"source"`
	Error     string `json:"error"`
	Example   string `json:"example"`
	Reason    string `json:"reason"`
	Category  string `json:"category"`
	Why       string `json:"why"`
	WantImage string `json:"want_image"`
}

const vocabPath = "testdata/pullvocab/vocab.jsonl"

func loadVocab(t testing.TB) []vocabEntry {
	t.Helper()
	return readJSONL[vocabEntry](t, vocabPath)
}

// TestRuntimeVocabulary classifies every example of the runtime vocabulary:
// each must be a pull failure of its line's category and name its image
// normalised (none when the example names none), and the remedy for it
// must name the image's registry or repository.
func TestRuntimeVocabulary(t *testing.T) {
	entries := loadVocab(t)
	if len(entries) < 200 {
		t.Fatalf("vocabulary has %d lines; it is meant to cover the runtimes' error catalogues", len(entries))
	}
	runtimes := []string{"containerd", "cri-o", "docker", "cri-dockerd", "kubelet"}
	seen := map[string]bool{}
	wrong := 0
	for i, e := range entries {
		line := i + 1
		if !slices.Contains(runtimes, e.Runtime) || e.Versions == "" || e.Source == "" || e.Error == "" || e.Why == "" || e.Reason == "" {
			t.Errorf("line %d: incomplete entry %+v", line, e)
		}
		if !slices.Contains(eventpipev1.PullCategories, e.Category) {
			t.Errorf("line %d: category %q is not a PullFailure category", line, e.Category)
		}
		key := e.Reason + "\x00" + e.Example
		if seen[key] {
			t.Errorf("line %d: duplicate example %q", line, e.Example)
		}
		seen[key] = true
		cat, img, detail, ok := ClassifyPull(e.Reason, e.Example)
		switch {
		case !ok:
			wrong++
			t.Errorf("line %d (%s %s): not recognised as a pull failure: %q", line, e.Runtime, e.Error, e.Example)
			continue
		case cat != e.Category:
			wrong++
			t.Errorf("line %d (%s %s): category %s, want %s: %q", line, e.Runtime, e.Error, cat, e.Category, e.Example)
		case img != e.WantImage:
			wrong++
			t.Errorf("line %d (%s %s): image %q, want %q: %q", line, e.Runtime, e.Error, img, e.WantImage, e.Example)
		}
		got := remedy.Pull(remedy.Input{Category: cat, Image: img, ImageRole: eventpipev1.ImageRoleWorkload, Node: "node-1", Detail: detail})
		if got == "" || strings.ContainsAny(got, "\n\r") || len(got) > 400 {
			t.Errorf("line %d: remedy %q", line, got)
		}
		// The remedy speaks of the cause the example names, where one
		// category holds several.
		lower := strings.ToLower(e.Example)
		switch cat {
		case eventpipev1.CategoryUnsupportedFormat:
			schema1 := strings.Contains(lower, "schema 1") || strings.Contains(lower, "prettyjws")
			if schema1 != strings.Contains(got, "schema 1") {
				t.Errorf("line %d: remedy for %q: %q", line, e.Error, got)
			}
		case eventpipev1.CategoryRuntimeStore:
			down := strings.Contains(lower, "dial unix") || strings.Contains(lower, "error reading from server") ||
				strings.Contains(lower, "docker daemon running")
			if down != strings.Contains(got, "is not answering the kubelet") {
				t.Errorf("line %d: remedy for %q: %q", line, e.Error, got)
			}
		case eventpipev1.CategoryPolicyRejected:
			registryPolicy := strings.Contains(lower, "configured policy") || strings.Contains(lower, "412 precondition") ||
				strings.Contains(lower, "is not signed")
			if registryPolicy != strings.Contains(got, "by its own pull policy") {
				t.Errorf("line %d: remedy for %q: %q", line, e.Error, got)
			}
		}
		if img != "" && cat != eventpipev1.CategoryInvalidReference {
			ref := remedy.ParseImageRef(img)
			if !strings.Contains(got, ref.Registry) && !strings.Contains(got, ref.Repository) && !strings.Contains(got, img) {
				t.Errorf("line %d (%s): remedy names neither %s nor its registry: %q", line, cat, img, got)
			}
		}
	}
	if wrong > 0 {
		t.Logf("%d of %d vocabulary examples wrong", wrong, len(entries))
	}
}
