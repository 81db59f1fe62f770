package cliflag

import (
	"flag"
	"fmt"
	"io"
)

// Deprecated registers old on fs as a deprecated spelling of the flag
// current, which must already be registered. Setting old sets current (so
// fs.Visit and fs.Lookup see current as set, and code reads one variable)
// and writes one warning line to warn naming the spelling to use. The alias
// is hidden from the usage: PrintDefaults lists it only as "deprecated".
func Deprecated(fs *flag.FlagSet, old, current string, warn io.Writer) {
	f := fs.Lookup(current)
	if f == nil {
		panic(fmt.Sprintf("cliflag: alias %q of unregistered flag %q", old, current))
	}
	fs.Var(&alias{fs: fs, target: f, old: old, warn: warn}, old, "deprecated: use --"+current)
}

// alias forwards Set to its target flag through fs.Set, which also marks the
// target as set.
type alias struct {
	fs     *flag.FlagSet
	target *flag.Flag
	old    string
	warn   io.Writer
}

func (a *alias) String() string {
	if a == nil || a.target == nil {
		return ""
	}
	return a.target.Value.String()
}

func (a *alias) Set(v string) error {
	fmt.Fprintf(a.warn, "warning: --%s is deprecated, use --%s\n", a.old, a.target.Name)
	return a.fs.Set(a.target.Name, v)
}

// IsBoolFlag lets a boolean alias stand without a value (--collector-insecure).
func (a *alias) IsBoolFlag() bool {
	b, ok := a.target.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Output normalises an -o value: "table" is accepted as another name of
// "text" (the line-per-item human format), so every command takes both.
func Output(v string) string {
	if v == "table" {
		return "text"
	}
	return v
}
