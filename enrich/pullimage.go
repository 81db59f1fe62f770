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
	if !plausibleReference(ref) {
		return ref
	}
	name, digest := ref, ""
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		name, digest = ref[:i], ref[i:]
	}
	tagged := strings.LastIndexByte(name, ':') > strings.LastIndexByte(name, '/')
	domain, path := "", name
	if i := strings.IndexByte(name, '/'); i >= 0 && isRegistryHost(name[:i]) {
		domain, path = name[:i], name[i+1:]
	}
	switch domain {
	case "":
		domain = "docker.io"
	case "index.docker.io":
		domain = "docker.io"
	}
	library := domain == "docker.io" && strings.IndexByte(path, '/') < 0
	latest := !tagged && digest == ""
	if len(domain)+1+len(path) == len(name) && !library && !latest {
		return ref // domain and path came from name unchanged
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

// isRegistryHost reports whether the first component of a reference names
// a registry (as the distribution reference rules decide: it has a dot or
// a port, is localhost, or has upper case, which a path cannot).
func isRegistryHost(s string) bool {
	if s == "localhost" || strings.ContainsAny(s, ".:") {
		return true
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// plausibleReference is a cheap check that ref parses as a reference: only
// reference characters, no empty component, no empty tag or digest, no
// upper case after the registry.
func plausibleReference(ref string) bool {
	if ref == "" || len(ref) > 512 {
		return false
	}
	name := ref
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		name = ref[:i]
		d := ref[i+1:]
		j := strings.IndexByte(d, ':')
		if j <= 0 || j == len(d)-1 || strings.IndexByte(d, '@') >= 0 {
			return false
		}
		for k := 0; k < len(d); k++ {
			if c := d[k]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == ':' || c == '+' || c == '.' || c == '_' || c == '-' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	if name == "" || name[0] == '/' || name[len(name)-1] == '/' || name[len(name)-1] == ':' || strings.Contains(name, "//") {
		return false
	}
	hostEnd := -1
	if i := strings.IndexByte(name, '/'); i >= 0 && isRegistryHost(name[:i]) {
		hostEnd = i
	}
	lastSlash := strings.LastIndexByte(name, '/')
	for k := 0; k < len(name); k++ {
		c := name[k]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == '/':
		case c == ':':
			// A port in the registry, or the tag after the last '/'.
			if k > hostEnd && k < lastSlash {
				return false
			}
		case c >= 'A' && c <= 'Z':
			// Upper case only in the registry or in the tag.
			if k > hostEnd && !(k > lastSlash && strings.IndexByte(name[lastSlash+1:k], ':') >= 0) {
				return false
			}
		default:
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
	if r := quotedAfter(msg, `short-name "`); r != "" {
		return r
	}
	// containers/image (CRI-O, Podman): the source being opened.
	if r := refAfter(msg, "docker://"); r != "" {
		return r
	}
	if r := quotedAfter(msg, `failed to resolve reference "`); r != "" {
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
	// Docker: "manifest for R:T not found", "image pull failed for R:T,",
	// "Error: image R:T not found". ("pull access denied for R" names the
	// repository without its tag: not a reference.)
	if r := refBetween(msg, "manifest for ", " not found"); r != "" {
		return r
	}
	if r := refAfter(msg, "image pull failed for "); r != "" {
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

// quotedAfter returns the text between prefix (which ends with a quote) and
// the next quote.
func quotedAfter(msg, prefix string) string {
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
