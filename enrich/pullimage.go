package enrich

import "strings"

// NormalizeImage returns an image reference the way the runtimes resolve
// it: containerd, CRI-O and Docker all parse it with the distribution
// reference grammar (github.com/distribution/reference, ParseDockerRef's
// normalisation): a reference without a registry is on docker.io, a
// one-part docker.io name is under library/, a reference with neither tag
// nor digest means :latest, index.docker.io is docker.io, and a digest is
// kept (with the tag, if both are given). A reference that does not parse
// (no name part, upper case in the path, a component that starts or ends
// with a separator, a registry name with invalid characters, an empty or
// over-long tag, a malformed digest, a bare 64-hex image id, a variable
// left unexpanded, spaces) is returned unchanged: it names what the user
// wrote, and the runtime rejected it. No allocation when ref is already
// normalised.
func NormalizeImage(ref string) string {
	p, ok := parseReference(ref)
	if !ok {
		return ref
	}
	domain, path := "docker.io", ref[p.pathStart:p.nameEnd]
	if p.domainEnd > 0 {
		if domain = ref[:p.domainEnd]; domain == "index.docker.io" {
			domain = "docker.io"
		}
	}
	library := domain == "docker.io" && strings.IndexByte(path, '/') < 0
	latest := !p.tagged && p.nameEnd == len(ref)
	if p.domainEnd > 0 && len(domain) == p.domainEnd && !library && !latest {
		return ref // already normalised
	}
	rest := ref[p.pathStart:] // path, tag and digest as written
	var b strings.Builder
	b.Grow(len(domain) + len("/library/") + len(rest) + len(":latest"))
	b.WriteString(domain)
	b.WriteByte('/')
	if library {
		b.WriteString("library/")
	}
	b.WriteString(rest)
	if latest {
		b.WriteString(":latest")
	}
	return b.String()
}

// parsedRef is where the parts of a reference end (indexes into it).
type parsedRef struct {
	domainEnd int  // end of the registry part; 0 when the reference names none
	pathStart int  // start of the repository path
	nameEnd   int  // end of the name and tag (start of "@digest", or len)
	tagged    bool // a tag follows the path
}

// Limits of the reference grammar.
const (
	maxRefLen     = 512 // longer is hostile, not a reference
	maxPathLen    = 255 // reference.RepositoryNameTotalLengthMax
	maxTagLen     = 128
	imageIDHexLen = 64
)

// parseReference checks ref against the distribution reference grammar
// the way ParseNormalizedNamed applies it, in one pass and without
// allocating:
//
//	reference := name [ ":" tag ] [ "@" digest ]
//	name      := [ domain "/" ] path-component [ "/" path-component ]*
//	domain    := host [ ":" port ] ; host: dot-separated labels of letters,
//	             digits and inner hyphens, or "[" IPv6 "]"
//	path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
//	tag       := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
//	digest    := sha256 ":" 64 hex | sha384 ":" 96 hex | sha512 ":" 128 hex
//
// The first component is the registry when it holds a dot or a colon, is
// localhost, or has upper case (which a path may not); a reference without
// a slash is a Docker Hub name even if it looks like a host. A bare 64-hex
// string is an image id, not a name.
func parseReference(ref string) (p parsedRef, ok bool) {
	if ref == "" || len(ref) > maxRefLen || isImageID(ref) {
		return p, false
	}
	p.nameEnd = len(ref)
	if at := strings.IndexByte(ref, '@'); at >= 0 {
		if !validDigest(ref[at+1:]) {
			return p, false
		}
		p.nameEnd = at
	}
	name := ref[:p.nameEnd]
	if slash := strings.IndexByte(name, '/'); slash >= 0 {
		first := name[:slash]
		if first == "localhost" || domainLike(first) {
			if !validDomain(first) {
				return p, false
			}
			p.domainEnd, p.pathStart = slash, slash+1
		}
	}
	rest := name[p.pathStart:]
	path := rest
	if colon := strings.IndexByte(rest, ':'); colon >= 0 {
		if !validTag(rest[colon+1:]) {
			return p, false
		}
		path, p.tagged = rest[:colon], true
	}
	// The length limit counts the path as normalised: a one-part Docker
	// Hub name gains "library/".
	n := len(path)
	if d := ref[:p.domainEnd]; (d == "" || d == "docker.io" || d == "index.docker.io") && strings.IndexByte(path, '/') < 0 {
		n += len("library/")
	}
	if n > maxPathLen || !validPath(path) {
		return p, false
	}
	return p, true
}

// isImageID: 64 lower-case hex digits, what ParseNormalizedNamed refuses
// as a name ("cannot specify 64-byte hexadecimal strings").
func isImageID(s string) bool {
	if len(s) != imageIDHexLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isLowerHex(s[i]) {
			return false
		}
	}
	return true
}

// Byte classes of the reference grammar, one table lookup a byte.
const (
	ccLower = 1 << iota // a-z 0-9
	ccUpper             // A-Z
	ccHex               // 0-9 a-f
	ccTag               // what a tag may hold after its first byte: word characters, '.', '-'
)

var refClass = func() (t [256]uint8) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] |= ccLower | ccTag
	}
	for c := '0'; c <= '9'; c++ {
		t[c] |= ccLower | ccTag | ccHex
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] |= ccHex
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] |= ccUpper | ccTag
	}
	t['_'], t['.'], t['-'] = ccTag, ccTag, ccTag
	return t
}()

func isLowerHex(c byte) bool { return refClass[c]&ccHex != 0 }

func isLowerAlnum(c byte) bool { return refClass[c]&ccLower != 0 }

func isAlnum(c byte) bool { return refClass[c]&(ccLower|ccUpper) != 0 }

// domainLike: s holds a dot, a colon or upper case, which a path
// component never does (splitDockerDomain's test, localhost aside).
func domainLike(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '.' || c == ':' || c >= 'A' && c <= 'Z' {
			return true
		}
	}
	return false
}

// validPath: path components separated by single slashes, each lower-case
// letters and digits joined by ".", "_", "__" or a run of "-".
func validPath(path string) bool {
	if path == "" {
		return false
	}
	for {
		slash := strings.IndexByte(path, '/')
		if slash < 0 {
			return validComponent(path)
		}
		if !validComponent(path[:slash]) {
			return false
		}
		path = path[slash+1:]
	}
}

func validComponent(c string) bool {
	if c == "" || !isLowerAlnum(c[0]) || !isLowerAlnum(c[len(c)-1]) {
		return false
	}
	for i := 1; i < len(c)-1; i++ {
		if isLowerAlnum(c[i]) {
			continue
		}
		// A separator: ".", "_", "__" or "-"+, between alphanumerics.
		j := i
		switch c[i] {
		case '.':
			j = i + 1
		case '_':
			j = i + 1
			if c[j] == '_' {
				j++
			}
		case '-':
			for j < len(c) && c[j] == '-' {
				j++
			}
		default:
			return false
		}
		if j >= len(c) || !isLowerAlnum(c[j]) {
			return false
		}
		i = j
	}
	return true
}

// validDomain: a host (DNS labels of letters, digits and inner hyphens
// joined by dots, or a bracketed IPv6 address) and an optional port.
func validDomain(d string) bool {
	host, port := d, ""
	if strings.HasPrefix(d, "[") {
		end := strings.IndexByte(d, ']')
		if end < 2 {
			return false
		}
		for i := 1; i < end; i++ {
			if c := d[i]; !(c == ':' || isLowerHex(c) || c >= 'A' && c <= 'F') {
				return false
			}
		}
		host, port = "", d[end+1:]
	} else if colon := strings.IndexByte(d, ':'); colon >= 0 {
		host, port = d[:colon], d[colon:]
	}
	if port != "" {
		if len(port) < 2 || port[0] != ':' {
			return false
		}
		for i := 1; i < len(port); i++ {
			if port[i] < '0' || port[i] > '9' {
				return false
			}
		}
	}
	if host == "" {
		return strings.HasPrefix(d, "[") // an IPv6 address, checked above
	}
	for {
		dot := strings.IndexByte(host, '.')
		label := host
		if dot >= 0 {
			label = host[:dot]
		}
		if !validLabel(label) {
			return false
		}
		if dot < 0 {
			return true
		}
		host = host[dot+1:]
	}
}

// validLabel: letters and digits, hyphens inside.
func validLabel(l string) bool {
	if l == "" || !isAlnum(l[0]) || !isAlnum(l[len(l)-1]) {
		return false
	}
	for i := 1; i < len(l)-1; i++ {
		if !isAlnum(l[i]) && l[i] != '-' {
			return false
		}
	}
	return true
}

// validTag: a word character first, then up to 127 word characters, dots
// and hyphens.
func validTag(t string) bool {
	if t == "" || len(t) > maxTagLen || t[0] == '.' || t[0] == '-' {
		return false
	}
	for i := 0; i < len(t); i++ {
		if refClass[t[i]]&ccTag == 0 {
			return false
		}
	}
	return true
}

// validDigest: "algorithm:hex" as the runtimes accept it (go-digest's
// registered algorithms, lower-case hex of the algorithm's length).
func validDigest(d string) bool {
	var n int
	switch {
	case strings.HasPrefix(d, "sha256:"):
		n = 64
	case strings.HasPrefix(d, "sha384:"):
		n = 96
	case strings.HasPrefix(d, "sha512:"):
		n = 128
	default:
		return false
	}
	hex := d[len("sha256:"):]
	if len(hex) != n {
		return false
	}
	for i := 0; i < len(hex); i++ {
		if !isLowerHex(hex[i]) {
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
