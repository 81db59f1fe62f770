package enrich

import (
	"slices"
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/remedy"
)

// Every category the classifier can answer has its own remedy, so a
// category added to the rules without a fix fails here.
func TestRemedyCoversEveryCategory(t *testing.T) {
	cats := append([]string{eventpipev1.CategoryUnknown}, allCategories...)
	for _, r := range rules {
		cats = append(cats, r.category)
	}
	for _, c := range cats {
		if !remedy.Known(c) {
			t.Errorf("category %q has no remedy", c)
		}
		// The schema's list is what consumers (the gateway's reasons) test
		// themselves against.
		if !slices.Contains(eventpipev1.PullCategories, c) {
			t.Errorf("category %q is missing from eventpipev1.PullCategories", c)
		}
	}
}

// Over the real pull-failure messages: the remedy is one line, names the
// image's registry or repository, and is short enough for a terminal.
func TestRemedyRealMessages(t *testing.T) {
	for i, m := range loadJSON[pullMessage](t, "testdata/pull_messages.json") {
		cat, img, detail, ok := ClassifyPull(m.Reason, m.Message)
		if !ok {
			continue // TestClassifyPullRealMessages reports it
		}
		got := remedy.Pull(remedy.Input{Category: cat, Image: img, ImageRole: eventpipev1.ImageRoleWorkload, Node: "node-1", Detail: detail})
		if strings.ContainsAny(got, "\n\r") {
			t.Errorf("entry %d: remedy spans lines: %q", i, got)
		}
		if len(got) > 400 {
			t.Errorf("entry %d: remedy of %d bytes: %q", i, len(got), got)
		}
		if img != "" {
			ref := remedy.ParseImageRef(img)
			if !strings.Contains(got, ref.Registry) && !strings.Contains(got, ref.Repository) && !strings.Contains(got, img) {
				t.Errorf("entry %d (%s): remedy names neither %s nor its registry: %q", i, cat, img, got)
			}
		}
	}
}
