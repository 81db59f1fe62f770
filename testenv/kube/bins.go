package kube

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// ModulePath is the main module whose root holds .bin and deploy/.
const ModulePath = "github.com/eventpipe/eventpipe"

// BinDirEnv names the environment variable that points at the binaries.
const BinDirEnv = "EVENTPIPE_BIN_DIR"

// RepoRoot walks up from the working directory to the directory whose go.mod
// declares ModulePath.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repo root: %w", err)
	}
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePathOf(mod) == ModulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find repo root: no go.mod of module %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

func modulePathOf(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// buildMu serializes build.sh runs within one process; build.sh itself takes
// a file lock against other test binaries.
var buildMu sync.Mutex

// binaries returns the directory holding the named executables, building
// them with testenv/build/build.sh when any is missing.
func binaries(ctx context.Context, binDir string, names []string, log func(string, ...any)) (string, error) {
	root, rootErr := RepoRoot()
	if binDir == "" {
		binDir = os.Getenv(BinDirEnv)
	}
	if binDir == "" {
		if rootErr != nil {
			return "", fmt.Errorf("locate binaries (set %s): %w", BinDirEnv, rootErr)
		}
		binDir = filepath.Join(root, ".bin")
	}
	missing := func() []string {
		var out []string
		for _, n := range names {
			if !isExecutable(filepath.Join(binDir, n)) {
				out = append(out, n)
			}
		}
		return out
	}
	if len(missing()) == 0 {
		return binDir, nil
	}
	if rootErr != nil {
		return "", fmt.Errorf("build missing binaries in %s: %w", binDir, rootErr)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	m := missing()
	if len(m) == 0 {
		return binDir, nil
	}
	script := filepath.Join(root, "testenv", "build", "build.sh")
	log("kube: %s missing in %s: running %s (a cold build takes 10-20 min on 2 cores)", strings.Join(m, ", "), binDir, script)
	cmd := exec.CommandContext(ctx, script, binDir)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build control plane with %s: %w\n%s", script, err, tail(out, 4000))
	}
	if m := missing(); len(m) > 0 {
		return "", fmt.Errorf("build control plane: build.sh succeeded but %s still missing", strings.Join(m, ", "))
	}
	return binDir, nil
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
