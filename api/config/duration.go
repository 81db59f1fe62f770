package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
)

// Day is the unit "d" of ParseDuration.
const Day = 24 * time.Hour

// MinDuration is the smallest positive duration any eventpipe setting
// takes; a smaller one is a typo (a missing unit, "ns" for "s").
const MinDuration = time.Millisecond

// ParseDuration is time.ParseDuration with one more unit: a leading number
// of days ("7d", "1d12h", "0.5d").
func ParseDuration(s string) (time.Duration, error) {
	in := s
	neg := false
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		neg = s[0] == '-'
		s = s[1:]
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	if i == 0 || i >= len(s) || s[i] != 'd' {
		return time.ParseDuration(in)
	}
	days, err := strconv.ParseFloat(s[:i], 64)
	if err != nil {
		return 0, fmt.Errorf("time: invalid duration %q", in)
	}
	var rest time.Duration
	if tail := s[i+1:]; tail != "" {
		if tail[0] == '-' || tail[0] == '+' {
			return 0, fmt.Errorf("time: invalid duration %q", in)
		}
		if rest, err = time.ParseDuration(tail); err != nil {
			return 0, fmt.Errorf("time: invalid duration %q", in)
		}
	}
	total := days*float64(Day) + float64(rest)
	if total > math.MaxInt64 {
		return 0, fmt.Errorf("time: invalid duration %q: too large", in)
	}
	d := time.Duration(total)
	if neg {
		d = -d
	}
	return d, nil
}

// FormatDuration writes d the way a person would: whole days as "7d",
// otherwise Go's form without trailing zero units ("1h30m", "90s").
func FormatDuration(d time.Duration) string {
	if d != 0 && d%Day == 0 {
		return fmt.Sprintf("%dd", d/Day)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

var durationType = reflect.TypeFor[time.Duration]()

// NormalizeDurations checks every key of the YAML document in data whose
// Go type (found through into, a pointer to the struct the document is
// decoded into, by yaml tags) is time.Duration. It refuses bare numbers
// other than 0, strings that are not durations, and positive values below
// MinDuration, each error naming the key's YAML path. It returns data with
// every day unit rewritten to Go's syntax ("7d" becomes "168h0m0s"), and a
// bare 0 as "0s", so either YAML library decodes it; lines stay where they were, so the decoder's
// own messages point at the user's lines.
func NormalizeDurations(data []byte, into any) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		// Not YAML: the decoder reports it with its own message.
		return data, nil
	}
	t := reflect.TypeOf(into)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	w := &walker{}
	if len(doc.Content) > 0 {
		w.walk(doc.Content[0], t, "")
	}
	if len(w.errs) > 0 {
		return nil, errors.Join(w.errs...)
	}
	if len(w.edits) == 0 {
		return data, nil
	}
	out, err := applyEdits(data, w.edits)
	if err != nil {
		return nil, err
	}
	return out, nil
}

type edit struct {
	line, col int // 1-based, as yaml.Node reports them (col in characters)
	old, new  string
	path      string
}

type walker struct {
	errs  []error
	edits []edit
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType {
		w.duration(n, path)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" && k.Tag == "!!merge" {
				if v.Kind == yaml.SequenceNode {
					for _, m := range v.Content {
						w.walk(m, t, path)
					}
				} else {
					w.walk(v, t, path)
				}
				continue
			}
			if ft, ok := fieldType(t, k.Value); ok {
				w.walk(v, ft, join(path, k.Value))
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			w.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

// fieldType finds the field a YAML key decodes into: by yaml tag, else the
// lower-cased field name (both YAML libraries' default), through inline
// structs.
func fieldType(t reflect.Type, key string) (reflect.Type, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if found, ok := fieldType(ft, key); ok {
					return found, true
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if name == key {
			return f.Type, true
		}
	}
	return nil, false
}

func (w *walker) duration(n *yaml.Node, path string) {
	if n.Kind != yaml.ScalarNode {
		return // the decoder says what is wrong with a list or a map here
	}
	v := strings.TrimSpace(n.Value)
	switch n.Tag {
	case "!!null":
		return
	case "!!int", "!!float":
		f, err := strconv.ParseFloat(strings.ReplaceAll(v, "_", ""), 64)
		if err == nil && f == 0 {
			// 0 means the same in every unit; written "0s" so that
			// either YAML library decodes it.
			w.edits = append(w.edits, edit{line: n.Line, col: n.Column, old: n.Value, new: "0s", path: path})
			return
		}
		w.errs = append(w.errs, fmt.Errorf("%s: %s is a bare number, which would be read as nanoseconds; write the unit%s",
			path, v, suggest(v)))
		return
	}
	d, err := ParseDuration(v)
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("%s: %q is not a duration; write a number with a unit: ms, s, m, h or d (e.g. 500ms, 30s, 5m, 1h, 7d)", path, n.Value))
		return
	}
	if d > 0 && d < MinDuration {
		w.errs = append(w.errs, fmt.Errorf("%s: %s is below %s, the smallest duration eventpipe takes; was another unit meant (s, ms)?", path, n.Value, MinDuration))
		return
	}
	if d < 0 && d > -MinDuration {
		w.errs = append(w.errs, fmt.Errorf("%s: %s is not a sensible duration", path, n.Value))
		return
	}
	if strings.Contains(v, "d") {
		w.edits = append(w.edits, edit{line: n.Line, col: n.Column, old: n.Value, new: d.String(), path: path})
	}
}

// suggest reads a bare number as seconds, the likeliest intent, and writes
// it with a unit.
func suggest(v string) string {
	f, err := strconv.ParseFloat(strings.ReplaceAll(v, "_", ""), 64)
	if err != nil || f < 0 || f > float64(math.MaxInt64/int64(time.Second)) || f != math.Trunc(f) {
		return ", e.g. 30s, 5m, 1h or 7d"
	}
	d := time.Duration(f) * time.Second
	if d >= Day && d%Day == 0 {
		return fmt.Sprintf(": if %s seconds were meant, write %dh or %dd", v, d/time.Hour, d/Day)
	}
	return fmt.Sprintf(": if %s seconds were meant, write %s", v, FormatDuration(d))
}

// applyEdits replaces each edited scalar in place, on its own line.
func applyEdits(data []byte, edits []edit) ([]byte, error) {
	lines := bytes.SplitAfter(data, []byte("\n"))
	// Right to left within a line, so earlier columns stay valid.
	sort.SliceStable(edits, func(i, j int) bool {
		if edits[i].line != edits[j].line {
			return edits[i].line < edits[j].line
		}
		return edits[i].col > edits[j].col
	})
	for _, e := range edits {
		if e.line < 1 || e.line > len(lines) {
			return nil, fmt.Errorf("%s: cannot rewrite %q; write it as %s", e.path, e.old, e.new)
		}
		ln := lines[e.line-1]
		// Column counts characters: find the byte offset.
		off := 0
		for c := 1; c < e.col && off < len(ln); c++ {
			_, size := utf8.DecodeRune(ln[off:])
			off += size
		}
		start := off
		if start < len(ln) && (ln[start] == '"' || ln[start] == '\'') {
			start++
		}
		if !bytes.HasPrefix(ln[start:], []byte(e.old)) {
			return nil, fmt.Errorf("%s: cannot rewrite %q; write it as %s", e.path, e.old, e.new)
		}
		var b []byte
		b = append(b, ln[:start]...)
		b = append(b, e.new...)
		b = append(b, ln[start+len(e.old):]...)
		lines[e.line-1] = b
	}
	return bytes.Join(lines, nil), nil
}
