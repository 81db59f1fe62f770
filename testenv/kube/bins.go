package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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

// binaries returns the paths of etcd and kube-apiserver, building them with
// testenv/build/build.sh when missing.
func binaries(ctx context.Context, binDir string, log func(string, ...any)) (etcd, apiserver string, err error) {
	root, rootErr := RepoRoot()
	if binDir == "" {
		binDir = os.Getenv(BinDirEnv)
	}
	if binDir == "" {
		if rootErr != nil {
			return "", "", fmt.Errorf("locate binaries (set %s): %w", BinDirEnv, rootErr)
		}
		binDir = filepath.Join(root, ".bin")
	}
	etcd = filepath.Join(binDir, "etcd")
	apiserver = filepath.Join(binDir, "kube-apiserver")
	if isExecutable(etcd) && isExecutable(apiserver) {
		return etcd, apiserver, nil
	}
	if rootErr != nil {
		return "", "", fmt.Errorf("build missing binaries in %s: %w", binDir, rootErr)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if isExecutable(etcd) && isExecutable(apiserver) {
		return etcd, apiserver, nil
	}
	script := filepath.Join(root, "testenv", "build", "build.sh")
	log("kube: %s or %s missing: running %s (a cold build takes ~5 min)", etcd, apiserver, script)
	cmd := exec.CommandContext(ctx, script, binDir)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("build control plane with %s: %w\n%s", script, err, tail(out, 4000))
	}
	if !isExecutable(etcd) || !isExecutable(apiserver) {
		return "", "", errors.New("build control plane: build.sh succeeded but the binaries are still missing")
	}
	return etcd, apiserver, nil
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
