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

// cleanFields cleans every string of f in place. Nearly always they are all
// short ASCII, which one pass over all of them proves for much less than a
// call to clean per string costs.
func cleanFields(f []string) {
	if fieldsASCII(f) {
		return
	}
	for i := range f {
		f[i] = clean(f[i])
	}
}

// fieldsASCII reports whether every string of f is ASCII (so valid UTF-8)
// and at most maxFieldBytes long: then clean returns each unchanged.
func fieldsASCII(f []string) bool {
	var acc uint64
	for _, s := range f {
		if len(s) > maxFieldBytes {
			return false
		}
		for len(s) >= 8 {
			acc |= uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
				uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
			s = s[8:]
		}
		for i := 0; i < len(s); i++ {
			acc |= uint64(s[i])
		}
	}
	return acc&0x8080808080808080 == 0
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
// `image tag "X"` (InvalidImageName), `Container image "X"`, and the escaped
// `image \"X\"` of the old FailedSync wrapper. One pass over the message.
//
// A message whose closing quote was lost (a report that cut it out:
// `Failed to pull image "X: rpc error: ...`) still names X: the kubelet
// writes `image "X": cause`, and a reference holds no space, so X ends at
// the first ": " when no quote closes it and no space comes before. A
// message cut inside the reference (no ": " after it) names none.
func imageFromMessage(msg string) string {
	for off := 0; off < len(msg); {
		i := strings.Index(msg[off:], "image ")
		if i < 0 {
			return ""
		}
		rest := msg[off+i+len("image "):]
		off += i + len("image ")
		if strings.HasPrefix(rest, "tag ") {
			rest = rest[len("tag "):]
		}
		var end int
		switch {
		case strings.HasPrefix(rest, `"`):
			rest = rest[1:]
			if end = strings.IndexByte(rest, '"'); end < 0 {
				end = unquotedEnd(rest)
			}
		case strings.HasPrefix(rest, `\"`):
			rest = rest[2:]
			end = strings.Index(rest, `\"`)
		default:
			continue
		}
		if end > 0 && end <= 512 {
			return rest[:end]
		}
	}
	return ""
}

// unquotedEnd is where a reference whose closing quote is missing ends:
// at the first ": ", if no space or tab comes before it; else -1.
func unquotedEnd(rest string) int {
	end := strings.Index(rest, ": ")
	if end <= 0 || strings.ContainsAny(rest[:end], " \t\n") {
		return -1
	}
	return end
}
