package enrich

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func validCategory(c string) bool {
	for _, k := range allCategories {
		if c == k {
			return true
		}
	}
	return false
}

// FuzzClassifyPull: no panic; a category is always one of the 15; the
// image is normalised; the matcher agrees with the plain reference
// implementation. Seeded with the pull corpus and the runtime vocabulary.
func FuzzClassifyPull(f *testing.F) {
	for _, m := range loadCorpus(f) {
		f.Add(m.Reason, m.Message)
	}
	// Every wording of the runtime vocabulary (testdata/pullvocab).
	for _, v := range loadVocab(f) {
		f.Add(v.Reason, v.Example)
	}
	f.Add("Failed", "")
	f.Add("BackOff", `Back-off pulling image "`)
	f.Add("ErrImagePull", "\xff\xfe")
	f.Fuzz(func(t *testing.T, reason, message string) {
		cat, img, detail, ok := ClassifyPull(reason, message)
		if !ok {
			if cat != "" || img != "" || detail != "" {
				t.Fatalf("not a pull failure but returned %q %q %q", cat, img, detail)
			}
			return
		}
		if !validCategory(cat) {
			t.Fatalf("category %q is not one of the 15", cat)
		}
		if NormalizeImage(img) != img {
			t.Fatalf("image %q is not normalised", img)
		}
		if !utf8.ValidString(detail) || len(detail) > 512 {
			t.Fatalf("detail not bounded valid UTF-8: %q", detail)
		}
		if len(message) <= maxClassifyBytes {
			raw := pullImageFromMessage(message)
			scan := strings.ToLower(message)
			if raw != "" {
				scan = strings.ReplaceAll(scan, strings.ToLower(raw), "\x00")
				if s := strings.ToLower(shortImage(raw)); s != strings.ToLower(raw) {
					scan = strings.ReplaceAll(scan, s, "\x00")
				}
			}
			want := referenceCategory(scan)
			if i := strings.Index(scan, aggregateMarker); i >= 0 {
				if a := referenceAttempts(scan[i+1:]); a != eventpipev1.CategoryUnknown {
					want = a
				}
			} else if i := strings.Index(scan, mirrorsMarker); i >= 0 && strings.Contains(scan[i:], mirrorsEnd) {
				if m := referenceMirrors(scan[i+len(mirrorsMarker):]); m != eventpipev1.CategoryUnknown {
					want = m
				}
			} else if i := strings.Index(scan, detailsMarker); i >= 0 {
				if d := referenceCategory(scan[i:]); d != eventpipev1.CategoryUnknown {
					want = d
				}
			}
			// Case-folding of the image can differ between the two (the
			// matcher skips the exact reference only); compare when the
			// message is ASCII lower-case, where they must agree.
			if message == strings.ToLower(message) && want != eventpipev1.CategoryUnknown && cat != want {
				t.Fatalf("matcher says %q, reference says %q for %q", cat, want, message)
			}
		}
	})
}

// referenceAttempts is attemptsBits's category done plainly: the attempts
// of the aggregate s (split at attemptSep) with the best attemptRank, and
// the first rule with a fragment in any of them.
func referenceAttempts(s string) string {
	return referenceBest(strings.Split(s, attemptSep))
}

// referenceBest is the first rule with a fragment in any of the parts
// whose own category has the best attemptRank.
func referenceBest(parts []string) string {
	best := attemptRanks
	for _, p := range parts {
		best = min(best, attemptRank(referenceCategory(p)))
	}
	for _, r := range rules {
		for _, p := range parts {
			if attemptRank(referenceCategory(p)) == best && referenceHas(p, r) {
				return r.category
			}
		}
	}
	return eventpipev1.CategoryUnknown
}

// referenceMirrors is mirrorsBits's category done plainly: the mirrors'
// answers (split at mirrorSep) and the origin's (after the last
// mirrorsEnd), the best attemptRank, and the first rule with a fragment
// in any source of that rank.
func referenceMirrors(s string) string {
	end := strings.LastIndex(s, mirrorsEnd)
	var parts []string
	if end > 0 {
		parts = strings.Split(s[:end], mirrorSep)
	}
	parts = append(parts, s[end+len(mirrorsEnd):])
	return referenceBest(parts)
}

// referenceCategory is the first rule with a fragment in the lower-cased s.
func referenceCategory(s string) string {
	for _, r := range rules {
		if referenceHas(s, r) {
			return r.category
		}
	}
	return eventpipev1.CategoryUnknown
}

// referenceHas reports whether a fragment of r is in s; for the signature
// rule, one "signature" not followed by "=" (a signed URL's query
// parameter), as pullScan has it.
func referenceHas(s string, r rule) bool {
	if len(r.fragments) == 1 && r.fragments[0] == signatureFragment {
		for _, p := range strings.Split(s, signatureFragment)[1:] {
			if !strings.HasPrefix(p, "=") {
				return true
			}
		}
		return false
	}
	return containsAny(s, r.fragments)
}

// FuzzEnrich: any event, any cache content: no panic, and the occurrence
// is a valid protobuf with bounded valid UTF-8. Seeded with every message
// of the pull corpus (all draws) and every example of the runtime
// vocabulary as pod events, so new wordings reach the tracker and the
// pod-status path too.
func FuzzEnrich(f *testing.F) {
	for _, m := range loadCorpus(f) {
		f.Add("Pod", "img-missing", "spec.initContainers{workspace-init}", m.Reason, m.Message, int64(1793268636), int32(2))
	}
	for _, v := range loadVocab(f) {
		f.Add("Pod", "img-missing", "spec.containers{supervisor}", v.Reason, v.Example, int64(1793268636), int32(3))
	}
	f.Add("Pod", "img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed, int64(1793268636), int32(4))
	f.Add("Pod", seedSupPod, "spec.containers{supervisor}", "BackOff", `Back-off pulling image "x"`, int64(0), int32(0))
	f.Add("Sandbox", "img-missing", "", "PodCreated", "Created pod", int64(-1), int32(-5))
	f.Add("PersistentVolumeClaim", "workspace-img-missing", "", "ProvisioningSucceeded", "ok", int64(253402300800), int32(1))
	f.Add("Pod", "os-supervisor-\xff", "spec.containers{", "\xff", strings.Repeat("\xc3", 70), int64(1), int32(1))
	cfg := NewDefaultConfig()
	cfg.MaxMessageBytes = 64
	e := mustNew(f, cfg, seedWorld().lookups())
	f.Fuzz(func(t *testing.T, kind, name, fieldPath, reason, message string, unix int64, count int32) {
		ev := &Event{
			APIVersion: "v1", Namespace: seedNS, Name: name, UID: name, ResourceVersion: reason,
			Involved: ObjectRef{Kind: kind, Namespace: seedNS, Name: name, FieldPath: fieldPath},
			Reason:   reason, Message: message, Count: count,
			LastTimestamp: time.Unix(unix, 0), EventTime: time.Unix(unix/2, 0),
		}
		o := e.Enrich(ev, time.Unix(unix, 0)).Occurrence
		if len(o.Message) > cfg.MaxMessageBytes || !utf8.ValidString(o.Message) {
			t.Fatalf("message not bounded: %d bytes", len(o.Message))
		}
		if o.OccurredAt.AsTime().Unix() <= 0 || o.OccurredAt.CheckValid() != nil {
			t.Fatalf("bad occurred_at %v", o.OccurredAt)
		}
		if _, err := proto.Marshal(o); err != nil {
			t.Fatalf("proto: %v", err)
		}
		if _, err := protojson.Marshal(o); err != nil {
			t.Fatalf("protojson: %v", err)
		}
		if o.PullFailure != nil && !validCategory(o.PullFailure.Category) {
			t.Fatalf("category %q", o.PullFailure.Category)
		}
		pod := &Pod{Meta: Meta{Namespace: seedNS, Name: name, UID: name, ResourceVersion: reason},
			Containers: []Container{{Name: fieldPath, Image: message, Init: count%2 == 0, WaitingReason: reason, WaitingMessage: message}}}
		for _, o := range e.DiagnosePod(pod, time.Unix(unix, 0)) {
			if _, err := protojson.Marshal(o); err != nil {
				t.Fatalf("DiagnosePod protojson: %v", err)
			}
		}
	})
}
