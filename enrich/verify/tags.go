package verify

import (
	"slices"
	"strings"
)

// newestTags returns at most n tags, highest version first. Registries'
// tag lists carry no dates, so "newest" is by version order: tags are
// compared chunk by chunk, digits as numbers (1.10 after 1.9), and a
// release sorts after its pre-releases (1.2.0 after 1.2.0-rc1). Moving
// tags such as latest and digest-like tags (sha256-...) are left out:
// they name no version a user would pin.
func newestTags(tags []string, n int) []string {
	var vs []string
	for _, t := range tags {
		if t == "latest" || strings.HasPrefix(t, "sha256-") {
			continue
		}
		vs = append(vs, t)
	}
	slices.SortFunc(vs, func(a, b string) int { return -compareVersions(a, b) })
	if len(vs) > n {
		vs = vs[:n]
	}
	return vs
}

// compareVersions orders two tags as versions (see newestTags).
func compareVersions(a, b string) int {
	a, b = strings.TrimPrefix(a, "v"), strings.TrimPrefix(b, "v")
	aMain, aPre, _ := strings.Cut(a, "-")
	bMain, bPre, _ := strings.Cut(b, "-")
	if c := compareChunks(aMain, bMain); c != 0 {
		return c
	}
	switch {
	case aPre == "" && bPre != "":
		return 1
	case aPre != "" && bPre == "":
		return -1
	}
	return compareChunks(aPre, bPre)
}

// compareChunks compares runs of digits numerically and everything else
// byte-wise.
func compareChunks(a, b string) int {
	for a != "" && b != "" {
		ca, ra := chunk(a)
		cb, rb := chunk(b)
		if isDigit(ca[0]) && isDigit(cb[0]) {
			na, nb := strings.TrimLeft(ca, "0"), strings.TrimLeft(cb, "0")
			if len(na) != len(nb) {
				return cmpInt(len(na), len(nb))
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
		} else if c := strings.Compare(ca, cb); c != 0 {
			return c
		}
		a, b = ra, rb
	}
	return cmpInt(len(a), len(b))
}

func chunk(s string) (string, string) {
	d := isDigit(s[0])
	i := 1
	for i < len(s) && isDigit(s[i]) == d {
		i++
	}
	return s[:i], s[i:]
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
