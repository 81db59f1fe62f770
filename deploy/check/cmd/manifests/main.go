// Command manifests writes the raw manifests in deploy/agent and
// deploy/collector from the Helm chart (make manifests).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/eventpipe/eventpipe/deploy/check"
)

func main() {
	root, err := check.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
	files, err := check.Manifests(context.Background(), root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := os.WriteFile(filepath.Join(root, p), files[p], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "manifests:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", p)
	}
}
