package enrich

import "strings"

// matcher finds, in one pass over a message, which of many fixed lower-case
// fragments occur in it (Aho-Corasick over an ASCII-folded byte stream).
// Each fragment carries a bit; a scan returns the union of the bits of the
// fragments found. Built once at init; read-only afterwards, so safe for
// concurrent use.
type matcher struct {
	class  [256]uint8 // byte -> alphabet class (0 = byte in no fragment)
	nclass int
	// fold is class with ASCII upper case mapped like lower case, so a scan
	// needs no per-byte case conversion.
	fold [256]uint32
	// state<<shift + class -> next state<<1 | 1 if that state has output:
	// most steps touch only this table. Rows are padded to a power of two
	// (1<<shift >= nclass) so a step shifts instead of multiplying, and 16
	// bits an entry keeps the table (a few thousand states) within the
	// core's cache.
	next  []uint16
	shift uint
	out   []uint32 // state -> bits of fragments ending here (with suffixes)
}

type fragment struct {
	text string
	bit  uint32
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func newMatcher(frags []fragment) *matcher {
	m := &matcher{}
	for _, f := range frags {
		for i := 0; i < len(f.text); i++ {
			c := lowerASCII(f.text[i])
			if m.class[c] == 0 {
				m.nclass++
				m.class[c] = uint8(m.nclass)
			}
		}
	}
	m.nclass++ // class 0 included
	// Trie.
	type node struct {
		child map[uint8]int
		out   uint32
	}
	nodes := []node{{child: map[uint8]int{}}}
	for _, f := range frags {
		s := 0
		for i := 0; i < len(f.text); i++ {
			c := m.class[lowerASCII(f.text[i])]
			nx, ok := nodes[s].child[c]
			if !ok {
				nodes = append(nodes, node{child: map[uint8]int{}})
				nx = len(nodes) - 1
				nodes[s].child[c] = nx
			}
			s = nx
		}
		nodes[s].out |= f.bit
	}
	// Failure links, breadth first, folded into a dense transition table.
	n := len(nodes)
	if n >= 1<<15 {
		panic("matcher: too many states for 16-bit transitions")
	}
	next := make([]uint32, n*m.nclass)
	m.out = make([]uint32, n)
	fail := make([]int, n)
	queue := []int{}
	for c := 0; c < m.nclass; c++ {
		if nx, ok := nodes[0].child[uint8(c)]; ok {
			next[c] = uint32(nx)
			queue = append(queue, nx)
		}
	}
	m.out[0] = nodes[0].out
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		m.out[s] = nodes[s].out | m.out[fail[s]]
		for c := 0; c < m.nclass; c++ {
			if nx, ok := nodes[s].child[uint8(c)]; ok {
				fail[nx] = int(next[fail[s]*m.nclass+c])
				next[s*m.nclass+c] = uint32(nx)
				queue = append(queue, nx)
			} else {
				next[s*m.nclass+c] = next[fail[s]*m.nclass+c]
			}
		}
	}
	// Tag transitions into states with output (outputs are final now),
	// into rows of 1<<shift entries.
	for 1<<m.shift < m.nclass {
		m.shift++
	}
	m.next = make([]uint16, n<<m.shift)
	for s := 0; s < n; s++ {
		for c := 0; c < m.nclass; c++ {
			nx := next[s*m.nclass+c]
			v := uint16(nx << 1)
			if m.out[nx] != 0 {
				v |= 1
			}
			m.next[s<<m.shift+c] = v
		}
	}
	for c := range m.fold {
		m.fold[c] = uint32(m.class[lowerASCII(byte(c))])
	}
	return m
}

// scan returns the union of the bits of fragments found in s, ignoring
// every occurrence of skip (the image reference, which must not classify)
// and of skipShort (the same reference without docker.io/library/).
func (m *matcher) scan(s, skip, skipShort string) uint32 {
	var bits uint32
	st := uint32(0) // state
	shift := uint32(m.shift) & 31
	next, fold := m.next, &m.fold
	// 0 never starts an image reference; a NUL in s is checked in full.
	var f1, f2 byte
	if skip != "" {
		f1 = skip[0]
	}
	if skipShort != "" {
		f2 = skipShort[0]
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == f1 || c == f2 {
			if skip != "" && strings.HasPrefix(s[i:], skip) {
				i += len(skip) - 1
				st = 0
				continue
			}
			if skipShort != "" && strings.HasPrefix(s[i:], skipShort) {
				i += len(skipShort) - 1
				st = 0
				continue
			}
		}
		nx := uint32(next[st<<shift+fold[c]])
		st = nx >> 1
		if nx&1 != 0 {
			bits |= m.out[st]
		}
	}
	return bits
}
