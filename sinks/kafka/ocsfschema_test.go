package kafka

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The OCSF validator: it reads the official schema files (vendored under
// testdata/ocsf-schema, see the README there), compiles an event class the
// way the schema defines it (extends chains, $include of profiles, the
// dictionary's types, enums and siblings under the class's and objects'
// refinements) and checks a JSON event against it: every attribute known to
// its class or object, profile attributes only where the class or object
// includes the profile and metadata.profiles declares it, required
// attributes and constraints in every object, types (with the types'
// patterns and limits), enum ids and their captions (99 "Other" with the
// source's own name), class, category and type ids and names. Nothing of the
// schema is typed in here.

const ocsfSchemaDir = "testdata/ocsf-schema"

// ocsfAttr is one attribute of a compiled class or object.
type ocsfAttr struct {
	typ         string
	isArray     bool
	required    bool
	deprecated  bool
	sibling     string
	enum        map[string]string // id -> caption
	fromProfile string            // the profile that brought it, "" for the class's own
}

// ocsfDef is a compiled class or object.
type ocsfDef struct {
	name, caption string
	attrs         map[string]*ocsfAttr
	atLeastOne    []string
	justOne       []string
	profiles      map[string]bool // profiles it includes
	classUID      int             // classes only
	categoryUID   int
	categoryName  string
}

type ocsfSchemaSet struct {
	fsys    fs.FS
	version string
	dict    map[string]map[string]any
	types   map[string]map[string]any
	objects map[string]*ocsfDef
	raws    map[string]map[string]any // by file path
	classes map[string]string         // class name -> file path
}

func readOCSFSchema(fsys fs.FS) (*ocsfSchemaSet, error) {
	s := &ocsfSchemaSet{fsys: fsys, objects: map[string]*ocsfDef{}, raws: map[string]map[string]any{}, classes: map[string]string{}}
	v, err := s.raw("version.json")
	if err != nil {
		return nil, err
	}
	s.version, _ = v["version"].(string)
	d, err := s.raw("dictionary.json")
	if err != nil {
		return nil, err
	}
	s.dict = submaps(d["attributes"])
	types, _ := d["types"].(map[string]any)
	s.types = submaps(types["attributes"])
	err = fs.WalkDir(fsys, "events", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(p, ".json") {
			return err
		}
		m, err := s.raw(p)
		if err != nil {
			return err
		}
		s.classes[fmt.Sprint(m["name"])] = p
		return nil
	})
	return s, err
}

func submaps(v any) map[string]map[string]any {
	out := map[string]map[string]any{}
	m, _ := v.(map[string]any)
	for k, x := range m {
		if sub, ok := x.(map[string]any); ok {
			out[k] = sub
		}
	}
	return out
}

func (s *ocsfSchemaSet) raw(p string) (map[string]any, error) {
	if m, ok := s.raws[p]; ok {
		return m, nil
	}
	b, err := fs.ReadFile(s.fsys, p)
	if err != nil {
		return nil, fmt.Errorf("ocsf schema: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("ocsf schema %s: %w", p, err)
	}
	s.raws[p] = m
	return m, nil
}

// merge overlays b on a (b wins), recursively for nested objects such as
// enums.
func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		am, aok := out[k].(map[string]any)
		bm, bok := v.(map[string]any)
		if aok && bok {
			out[k] = merge(am, bm)
		} else {
			out[k] = v
		}
	}
	return out
}

// rawDef is a class or object before the dictionary is applied: attribute
// definitions (merged along extends and $include), the profile each
// attribute came from, constraints and included profiles.
type rawDef struct {
	attrs       map[string]map[string]any
	fromProfile map[string]string
	constraints map[string]any
	profiles    map[string]bool
	category    string
}

func (s *ocsfSchemaSet) rawDef(p string) (*rawDef, map[string]any, error) {
	m, err := s.raw(p)
	if err != nil {
		return nil, nil, err
	}
	d := &rawDef{attrs: map[string]map[string]any{}, fromProfile: map[string]string{}, profiles: map[string]bool{}}
	if parent, ok := m["extends"].(string); ok {
		pp := "objects/" + parent + ".json"
		if strings.HasPrefix(p, "events/") {
			if pp, ok = s.classes[parent]; !ok {
				return nil, nil, fmt.Errorf("%s extends %s, which is not in the vendored schema", p, parent)
			}
		}
		base, _, err := s.rawDef(pp)
		if err != nil {
			return nil, nil, err
		}
		for k, v := range base.attrs {
			d.attrs[k] = v
		}
		for k, v := range base.fromProfile {
			d.fromProfile[k] = v
		}
		for k := range base.profiles {
			d.profiles[k] = true
		}
		d.constraints, d.category = base.constraints, base.category
	}
	attrs, _ := m["attributes"].(map[string]any)
	incs, _ := attrs["$include"].([]any)
	for _, inc := range incs {
		im, err := s.raw(fmt.Sprint(inc))
		if err != nil {
			return nil, nil, err
		}
		profile := ""
		if im["meta"] == "profile" {
			profile = fmt.Sprint(im["name"])
			d.profiles[profile] = true
		}
		for k, v := range submaps(im["attributes"]) {
			if _, had := d.attrs[k]; !had && profile != "" {
				d.fromProfile[k] = profile
			}
			d.attrs[k] = merge(d.attrs[k], v)
		}
	}
	for k, v := range submaps(attrs) {
		d.attrs[k] = merge(d.attrs[k], v)
	}
	if c, ok := m["constraints"].(map[string]any); ok && len(c) > 0 {
		d.constraints = c
	}
	if c, ok := m["category"].(string); ok {
		d.category = c
	}
	return d, m, nil
}

// compile applies the dictionary to a raw definition.
func (s *ocsfSchemaSet) compile(p string) (*ocsfDef, error) {
	rd, m, err := s.rawDef(p)
	if err != nil {
		return nil, err
	}
	def := &ocsfDef{name: fmt.Sprint(m["name"]), caption: fmt.Sprint(m["caption"]), attrs: map[string]*ocsfAttr{}, profiles: rd.profiles}
	for k, local := range rd.attrs {
		dict, ok := s.dict[k]
		if !ok {
			return nil, fmt.Errorf("%s: attribute %s is not in the dictionary", p, k)
		}
		def.attrs[k] = attrOf(merge(dict, local), rd.fromProfile[k])
	}
	for _, x := range asList(rd.constraints["at_least_one"]) {
		def.atLeastOne = append(def.atLeastOne, x)
	}
	for _, x := range asList(rd.constraints["just_one"]) {
		def.justOne = append(def.justOne, x)
	}
	if uid, ok := m["uid"].(float64); ok && strings.HasPrefix(p, "events/") {
		cats, err := s.raw("categories.json")
		if err != nil {
			return nil, err
		}
		cat := submaps(cats["attributes"])[rd.category]
		cu, _ := cat["uid"].(float64)
		def.categoryUID, def.categoryName = int(cu), fmt.Sprint(cat["caption"])
		def.classUID = def.categoryUID*1000 + int(uid)
		// The schema generates these two enums per class (the base event
		// lists only Base Event and Uncategorized).
		def.attrs["class_uid"].enum = map[string]string{strconv.Itoa(def.classUID): def.caption}
		def.attrs["category_uid"].enum = map[string]string{strconv.Itoa(def.categoryUID): def.categoryName}
	}
	return def, nil
}

// attrOf reads an attribute definition (the dictionary's, refined by a
// class or object).
func attrOf(full map[string]any, profile string) *ocsfAttr {
	a := &ocsfAttr{fromProfile: profile, enum: map[string]string{}}
	a.typ, _ = full["type"].(string)
	a.isArray, _ = full["is_array"].(bool)
	a.required = full["requirement"] == "required"
	_, a.deprecated = full["@deprecated"]
	a.sibling, _ = full["sibling"].(string)
	for id, e := range submaps(full["enum"]) {
		a.enum[id], _ = e["caption"].(string)
	}
	return a
}

func asList(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func (s *ocsfSchemaSet) object(name string) (*ocsfDef, error) {
	if d, ok := s.objects[name]; ok {
		return d, nil
	}
	d, err := s.compile("objects/" + name + ".json")
	if err != nil {
		return nil, err
	}
	s.objects[name] = d
	return d, nil
}

func (s *ocsfSchemaSet) class(name string) (*ocsfDef, error) {
	p, ok := s.classes[name]
	if !ok {
		return nil, fmt.Errorf("class %s is not in the vendored schema", name)
	}
	return s.compile(p)
}

// ocsfCheck is one validation of one event.
type ocsfCheck struct {
	s        *ocsfSchemaSet
	declared map[string]bool // metadata.profiles
	included map[string]bool // profiles the class and the objects present include
	errs     []string
}

func (c *ocsfCheck) bad(f string, a ...any) { c.errs = append(c.errs, fmt.Sprintf(f, a...)) }

// validate checks the decoded event (json.Decoder.UseNumber) against class.
func (s *ocsfSchemaSet) validate(class *ocsfDef, ev map[string]any) []string {
	c := &ocsfCheck{s: s, declared: map[string]bool{}, included: map[string]bool{}}
	meta, _ := ev["metadata"].(map[string]any)
	for _, p := range asAnyList(meta["profiles"]) {
		c.declared[fmt.Sprint(p)] = true
	}
	c.object("", class, ev)
	for p := range c.declared {
		if !c.included[p] {
			c.bad("metadata.profiles declares %q, which neither class %s nor any object of the event includes", p, class.name)
		}
	}
	// Classification: ids and names of the class, its category and type.
	num := func(k string) int64 {
		n, _ := ev[k].(json.Number)
		i, _ := n.Int64()
		return i
	}
	if num("class_uid") != int64(class.classUID) || ev["class_name"] != class.caption {
		c.bad("class_uid %v class_name %v, want %d %q", ev["class_uid"], ev["class_name"], class.classUID, class.caption)
	}
	if num("category_uid") != int64(class.categoryUID) || ev["category_name"] != class.categoryName {
		c.bad("category_uid %v category_name %v, want %d %q", ev["category_uid"], ev["category_name"], class.categoryUID, class.categoryName)
	}
	act := num("activity_id")
	wantType := int64(class.classUID)*100 + act
	if num("type_uid") != wantType || ev["type_name"] != class.caption+": "+class.attrs["activity_id"].enum[strconv.FormatInt(act, 10)] {
		c.bad("type_uid %v type_name %v, want %d %q", ev["type_uid"], ev["type_name"], wantType,
			class.caption+": "+class.attrs["activity_id"].enum[strconv.FormatInt(act, 10)])
	}
	if meta != nil && meta["version"] != s.version {
		c.bad("metadata.version %v, want %s", meta["version"], s.version)
	}
	sort.Strings(c.errs)
	return c.errs
}

func asAnyList(v any) []any { l, _ := v.([]any); return l }

func (c *ocsfCheck) object(at string, def *ocsfDef, m map[string]any) {
	for p := range def.profiles {
		c.included[p] = true
	}
	where := def.name
	if at != "" {
		where = at + " (" + def.name + ")"
	}
	for k, v := range m {
		a, ok := def.attrs[k]
		if !ok {
			c.bad("%s: %s is not an attribute of %s", where, k, def.name)
			// Still check what it holds, by the dictionary's definition,
			// so that one misplaced object does not hide its own faults.
			if d, known := c.s.dict[k]; known {
				c.value(join(at, k), attrOf(d, ""), v, m)
			}
			continue
		}
		if a.fromProfile != "" && !c.declared[a.fromProfile] {
			c.bad("%s: %s belongs to profile %q, which metadata.profiles does not declare", where, k, a.fromProfile)
		}
		if a.deprecated {
			c.bad("%s: %s is deprecated", where, k)
		}
		c.value(join(at, k), a, v, m)
	}
	var names []string
	for k, a := range def.attrs {
		// A profile's required attributes are required where the profile
		// is applied.
		if _, ok := m[k]; !ok && a.required && (a.fromProfile == "" || c.declared[a.fromProfile]) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		c.bad("%s: required attribute %s is missing", where, k)
	}
	if len(def.atLeastOne) > 0 && count(m, def.atLeastOne) == 0 {
		c.bad("%s: needs at least one of %v", where, def.atLeastOne)
	}
	if len(def.justOne) > 0 && count(m, def.justOne) != 1 {
		c.bad("%s: needs exactly one of %v", where, def.justOne)
	}
}

func count(m map[string]any, keys []string) int {
	n := 0
	for _, k := range keys {
		if _, ok := m[k]; ok {
			n++
		}
	}
	return n
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

func (c *ocsfCheck) value(at string, a *ocsfAttr, v any, parent map[string]any) {
	if a.isArray {
		l, ok := v.([]any)
		if !ok {
			c.bad("%s: %T, want an array of %s", at, v, a.typ)
			return
		}
		for i, x := range l {
			c.one(fmt.Sprintf("%s[%d]", at, i), a, x, parent)
		}
		return
	}
	c.one(at, a, v, parent)
}

func (c *ocsfCheck) one(at string, a *ocsfAttr, v any, parent map[string]any) {
	if _, primitive := c.s.types[a.typ]; !primitive {
		m, ok := v.(map[string]any)
		if !ok {
			c.bad("%s: %T, want a %s object", at, v, a.typ)
			return
		}
		if a.typ == "object" { // free-form (unmapped)
			return
		}
		def, err := c.s.object(a.typ)
		if err != nil {
			c.bad("%s: %v", at, err)
			return
		}
		c.object(at, def, m)
		return
	}
	c.primitive(at, a.typ, v)
	if len(a.enum) == 0 {
		return
	}
	id := fmt.Sprint(v)
	caption, ok := a.enum[id]
	if !ok {
		c.bad("%s: %s is not one of the enum's values %v", at, id, keys(a.enum))
		return
	}
	name, has := parent[a.sibling]
	if a.sibling == "" || !has {
		return
	}
	if id == "99" {
		if s, _ := name.(string); s == "" || s == caption {
			c.bad("%s is 99 (%s): %s must carry the source's own value, not %q", at, caption, a.sibling, name)
		}
		return
	}
	if name != caption {
		c.bad("%s is %s: %s is %q, want %q", at, id, a.sibling, name, caption)
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var regexps sync.Map

// primitive checks v against a dictionary type, following the type's base
// types for the JSON kind and applying each one's pattern, length and range.
func (c *ocsfCheck) primitive(at, typ string, v any) {
	for t := typ; t != ""; {
		def := c.s.types[t]
		if re, ok := def["regex"].(string); ok {
			r, _ := regexps.LoadOrStore(re, regexp.MustCompile(re))
			if s, isStr := v.(string); isStr && !r.(*regexp.Regexp).MatchString(s) {
				c.bad("%s: %q does not match %s's pattern", at, s, t)
			}
		}
		if ml, ok := def["max_len"].(float64); ok {
			if s, isStr := v.(string); isStr && len(s) > int(ml) {
				c.bad("%s: longer than %s's %d", at, t, int(ml))
			}
		}
		if r, ok := def["range"].([]any); ok && len(r) == 2 {
			if n, isNum := v.(json.Number); isNum {
				f, _ := n.Float64()
				if f < r[0].(float64) || f > r[1].(float64) {
					c.bad("%s: %v is outside %s's range %v", at, n, t, r)
				}
			}
		}
		base, _ := def["type"].(string)
		if base == "" {
			c.kind(at, t, v)
		}
		t = base
	}
}

func (c *ocsfCheck) kind(at, base string, v any) {
	ok := false
	switch base {
	case "string_t":
		_, ok = v.(string)
	case "integer_t", "long_t":
		n, isNum := v.(json.Number)
		_, err := n.Int64()
		ok = isNum && err == nil
	case "float_t":
		_, ok = v.(json.Number)
	case "boolean_t":
		_, ok = v.(bool)
	case "json_t":
		ok = true
	default:
		c.bad("%s: base type %s unknown to this validator", at, base)
		return
	}
	if !ok {
		c.bad("%s: %v (%T) is not a %s", at, v, v, base)
	}
}

// vendoredOCSF is the vendored schema, read once per test binary.
var vendoredOCSF = sync.OnceValues(func() (*ocsfSchemaSet, error) {
	return readOCSFSchema(os.DirFS(ocsfSchemaDir))
})

// ocsfClass is the compiled class eventpipe writes, from the vendored
// schema.
func ocsfClass(t testing.TB) (*ocsfSchemaSet, *ocsfDef) {
	t.Helper()
	s, err := vendoredOCSF()
	if err != nil {
		t.Fatal(err)
	}
	class, err := s.class("application_lifecycle")
	if err != nil {
		t.Fatal(err)
	}
	return s, class
}
