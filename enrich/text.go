package enrich

import (
	"strings"
	"unicode/utf8"
)

// maxFieldBytes bounds every string field other than the message (object
// names are at most 253 bytes; anything longer is hostile).
const maxFieldBytes = 1024

// clean makes s valid UTF-8 and at most maxFieldBytes long.
func clean(s string) string {
	if len(s) <= maxFieldBytes && utf8.ValidString(s) {
		return s
	}
	out, _ := truncateUTF8(s, maxFieldBytes)
	return out
}

// cleanImage is clean for image references (at most 512 bytes).
func cleanImage(s string) string {
	if len(s) <= 512 && utf8.ValidString(s) {
		return s
	}
	out, _ := truncateUTF8(s, 512)
	return out
}

// truncateUTF8 replaces invalid UTF-8 with U+FFFD and cuts s to at most max
// bytes (marker included) at a rune boundary, ending with TruncationMarker.
func truncateUTF8(s string, max int) (string, bool) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if max <= 0 || len(s) <= max {
		return s, false
	}
	cut := max - len(TruncationMarker)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + TruncationMarker, true
}

// containerFromFieldPath parses spec.containers{NAME},
// spec.initContainers{NAME} and spec.ephemeralContainers{NAME}.
func containerFromFieldPath(fp string) (name string, init bool) {
	for _, p := range [...]struct {
		prefix string
		init   bool
	}{{"spec.containers{", false}, {"spec.initContainers{", true}, {"spec.ephemeralContainers{", false}} {
		if strings.HasPrefix(fp, p.prefix) {
			rest := fp[len(p.prefix):]
			if i := strings.IndexByte(rest, '}'); i > 0 {
				return rest[:i], p.init
			}
			return "", false
		}
	}
	return "", false
}

// imageFromMessage returns the image a kubelet message quotes: `image "X"`,
// `image tag "X"` (InvalidImageName), `Container image "X"`.
func imageFromMessage(msg string) string {
	for _, marker := range [...]string{`image "`, `image tag "`, `image \"`} {
		i := strings.Index(msg, marker)
		if i < 0 {
			continue
		}
		rest := msg[i+len(marker):]
		end := strings.IndexByte(rest, '"')
		if marker == `image \"` {
			end = strings.Index(rest, `\"`)
		}
		if end <= 0 || end > 512 {
			continue
		}
		return rest[:end]
	}
	return ""
}
