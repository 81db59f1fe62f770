// Command kubeparts is the testenv's multi-call binary of Kubernetes parts
// built from k8s.io/kubernetes (this wrapper module): one link, one binary
// for every part a test starts besides kube-apiserver. The first argument
// names the part: `kubeparts hollow-kubelet --name=node-1 ...`; a symlink
// named after a part runs it too (`kubectl` -> kubeparts, made by build.sh).
//
// Each part registers itself from its own file (register in an init), so
// parts are added without touching the others.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// part is one command of the binary: it gets the arguments after its name
// and returns the process's exit code.
type part func(args []string) int

var parts = map[string]part{}

func register(name string, p part) {
	if _, dup := parts[name]; dup {
		panic("kubeparts: part registered twice: " + name)
	}
	parts[name] = p
}

func main() {
	names := make([]string, 0, len(parts))
	for n := range parts {
		names = append(names, n)
	}
	sort.Strings(names)
	if p := parts[filepath.Base(os.Args[0])]; p != nil {
		os.Exit(p(os.Args[1:]))
	}
	if len(os.Args) < 2 || parts[os.Args[1]] == nil {
		fmt.Fprintf(os.Stderr, "usage: %s PART [flags]\nparts: %s\n", os.Args[0], strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(parts[os.Args[1]](os.Args[2:]))
}
