package enrich

import "strings"

// NormalizeImage returns an image reference the way the runtimes resolve
// it (containerd and CRI-O through the distribution reference rules, Docker
// likewise): a reference without a registry is on docker.io, a one-part
// docker.io name is under library/, a reference with neither tag nor digest
// means :latest, index.docker.io is docker.io, and a digest is kept (with
// the tag, if both are given). A reference that does not parse (upper case
// in the path, a variable left unexpanded, an empty tag, spaces) is
// returned unchanged: it names what the user wrote, and the runtime
// rejected it. No allocation when ref is already normalised.
func NormalizeImage(ref string) string {
	name, digest := ref, ""
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		name, digest = ref[:i], ref[i:]
		if !validDigest(digest[1:]) {
			return ref
		}
	}
	p, ok := parseName(name)
	if !ok {
		return ref
	}
	domain, path := "docker.io", name
	if p.host {
		domain, path = name[:p.firstSlash], name[p.firstSlash+1:]
		if domain == "index.docker.io" {
			domain = "docker.io"
		}
	}
	library := domain == "docker.io" && strings.IndexByte(path, '/') < 0
	latest := !p.tagged && digest == ""
	if p.host && len(domain) == p.firstSlash && !library && !latest {
		return ref // already normalised
	}
	var b strings.Builder
	b.Grow(len(domain) + len("/library/") + len(path) + len(":latest") + len(digest))
	b.WriteString(domain)
	b.WriteByte('/')
	if library {
		b.WriteString("library/")
	}
	b.WriteString(path)
	if latest {
		b.WriteString(":latest")
	}
	b.WriteString(digest)
	return b.String()
}

// Byte classes of a reference name.
const (
	rcBad = iota
	rcLower
	rcUpper
	rcDot
	rcColon
	rcSlash
)

var refClass = func() (t [256]uint8) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = rcLower
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = rcLower
	}
	t['_'], t['-'] = rcLower, rcLower
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = rcUpper
	}
	t['.'], t[':'], t['/'] = rcDot, rcColon, rcSlash
	return t
}()

// parsedName is what NormalizeImage needs to know about a name (the
// reference without its digest).
type parsedName struct {
	firstSlash int  // -1 when none
	host       bool // the first component names a registry
	tagged     bool
}

// parseName checks, in one pass, that name parses as a reference name (the
// distribution reference rules, simplified): no empty component, a colon
// only as the registry's port or before the tag of the last component,
// upper case only in the registry or the tag, a non-empty tag. The first
// component names a registry when it has a dot, a colon or upper case, or
// is localhost.
func parseName(name string) (p parsedName, ok bool) {
	p.firstSlash = -1
	if name == "" || len(name) > 512 {
		return p, false
	}
	compStart := 0
	colon := -1      // colon in the current component
	upper := false   // upper case before that colon in the current component
	special := false // a dot in the first component
	for k := 0; k <= len(name); k++ {
		c := uint8(rcSlash) // the end closes the last component
		if k < len(name) {
			if c = refClass[name[k]]; c == rcLower {
				continue
			}
		}
		switch c {
		case rcBad:
			return p, false
		case rcUpper:
			if colon < 0 {
				upper = true
			}
		case rcDot:
			if p.firstSlash < 0 {
				special = true
			}
		case rcColon:
			if colon >= 0 && p.firstSlash >= 0 {
				return p, false
			}
			colon = k
		case rcSlash:
			if k == compStart {
				return p, false // empty component
			}
			last := k == len(name)
			if p.firstSlash < 0 && !last {
				p.firstSlash = k
				p.host = special || colon >= 0 || upper || name[:k] == "localhost"
				if !p.host && colon >= 0 {
					return p, false
				}
				compStart, colon, upper = k+1, -1, false
				continue
			}
			if upper || (colon >= 0 && !last) || colon == k-1 {
				return p, false
			}
			p.tagged = colon >= 0
			compStart, colon, upper = k+1, -1, false
		}
	}
	return p, true
}

// validDigest: "algorithm:hex", both non-empty.
func validDigest(d string) bool {
	i := strings.IndexByte(d, ':')
	if i <= 0 || i == len(d)-1 {
		return false
	}
	for k := 0; k < len(d); k++ {
		c := d[k]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c >= 'A' && c <= 'F' || c == ':' || c == '+' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// pullImageFromMessage is the image a pull-failure message names: the
// kubelet's quoted `image "X"` (imageFromMessage) or, for messages that
// quote none, the reference in the runtime's own words. The reference is as
// the message writes it; composed references (a tag and a repository named
// apart) are allocated.
func pullImageFromMessage(msg string) string {
	if img := imageFromMessage(msg); img != "" {
		return img
	}
	return imageFromCause(msg)
}

// imageFromCause finds the reference in a runtime's words when the kubelet
// quoted none (a message of InspectFailed with `image ""`, a bare cause,
// an old Docker message).
func imageFromCause(msg string) string {
	// CRI-O / containers-image short-name resolution.
	if r := refAfter(msg, "image name "); r != "" {
		return r
	}
	if r := pullQuotedAfter(msg, `short-name "`); r != "" {
		return r
	}
	// containers/image (CRI-O, Podman): the source being opened.
	if r := refAfter(msg, "docker://"); r != "" {
		return r
	}
	if r := pullQuotedAfter(msg, `failed to resolve reference "`); r != "" {
		return r
	}
	// "reading manifest T in R" (containers/image) and "Tag T not found in
	// repository R" (Docker): the tag and the repository apart.
	if r := tagInRepo(msg, "reading manifest ", " in "); r != "" {
		return r
	}
	if r := tagInRepo(msg, "Tag ", " not found in repository "); r != "" {
		return r
	}
	// Docker: "manifest for R:T not found", "image pull failed for R:T, this
	// may be because" (not "image pull failed for unknown error"),
	// "Error: image R:T not found". ("pull access denied for R" names the
	// repository without its tag: not a reference.)
	if r := refBetween(msg, "manifest for ", " not found"); r != "" {
		return r
	}
	if r := refBetween(msg, "image pull failed for ", ","); r != "" {
		return r
	}
	// The kubelet's RegistryUnavailable and SignatureValidationFailed
	// messages: "image pull failed for R because the ...".
	if r := refBetween(msg, "image pull failed for ", " because"); r != "" {
		return r
	}
	return refBetween(msg, "Error: image ", " not found")
}

// refBetween is refAfter when the reference is followed by suffix.
func refBetween(msg, prefix, suffix string) string {
	i := strings.Index(msg, prefix)
	if i < 0 {
		return ""
	}
	r := refToken(msg[i+len(prefix):])
	if r == "" || !strings.HasPrefix(msg[i+len(prefix)+len(r):], suffix) {
		return ""
	}
	return r
}

// refAfter returns the reference that follows the first occurrence of
// prefix: up to a space, a comma, a quote, a parenthesis or ": ".
func refAfter(msg, prefix string) string {
	i := strings.Index(msg, prefix)
	if i < 0 {
		return ""
	}
	return refToken(msg[i+len(prefix):])
}

func refToken(s string) string {
	end := len(s)
	for k := 0; k < len(s); k++ {
		c := s[k]
		if c == ' ' || c == ',' || c == '"' || c == '\'' || c == ')' || c == '\\' || c == '\n' || c == '\t' {
			end = k
			break
		}
		if c == ':' && (k+1 == len(s) || s[k+1] == ' ') {
			end = k
			break
		}
	}
	if end == 0 || end > 512 {
		return ""
	}
	return s[:end]
}

// pullQuotedAfter returns the text between prefix (which ends with a quote) and
// the next quote.
func pullQuotedAfter(msg, prefix string) string {
	i := strings.Index(msg, prefix)
	if i < 0 {
		return ""
	}
	s := msg[i+len(prefix):]
	end := strings.IndexByte(s, '"')
	if end <= 0 || end > 512 {
		return ""
	}
	return s[:end]
}

// tagInRepo composes "R:T" (or "R@T" for a digest) from "<pre>T<mid>R".
func tagInRepo(msg, pre, mid string) string {
	i := strings.Index(msg, pre)
	if i < 0 {
		return ""
	}
	s := msg[i+len(pre):]
	j := strings.Index(s, mid)
	if j <= 0 || strings.IndexByte(s[:j], ' ') >= 0 {
		return ""
	}
	tag := s[:j]
	repo := refToken(s[j+len(mid):])
	if repo == "" {
		return ""
	}
	if strings.HasPrefix(tag, "sha256:") {
		return repo + "@" + tag
	}
	return repo + ":" + tag
}
