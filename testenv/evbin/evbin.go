// Package evbin builds the eventpipe binary for the tests and harnesses that
// run it as a process (collector kills, the driver proxy, the agent, the CLI
// a test types into).
//
// Every such binary is built with the release image's compile flags
// (deploy/image: CGO_ENABLED=0, -trimpath). Two reasons. The binary a test
// runs is then the kind that ships: static, the pure-Go resolver, no local
// paths. And the Go build cache keys a compiled package by its flags, so one
// compile of the eventpipe packages and their dependencies serves every test
// that builds the binary, `make build` and the image build alike; with plain
// `go build` here and the release flags there, a cold `make test` compiled
// the whole client stack twice (bench/build.md). Only link flags (-ldflags)
// and build tags may differ between callers without recompiling.
package evbin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Package is the package Build compiles, relative to the repository root.
const Package = "./cmd/eventpipe"

// Build compiles Package of the repository at root into out. extra goes to
// `go build` before the package (for example "-tags", "agentonly" or
// "-ldflags", "-X ..."). The output of a failed build is in the error.
func Build(ctx context.Context, root, out string, extra ...string) error {
	if out == "" {
		return fmt.Errorf("evbin: out is required")
	}
	args := append(append([]string{}, extra...), "-o", out, Package)
	return Go(ctx, root, "build", args...)
}

// Go runs the go command's subcommand (build, or test -c for a test binary
// of the release kind) in root with the release image's compile flags, args
// after them. The output of a failed run is in the error.
func Go(ctx context.Context, root, subcommand string, args ...string) error {
	if root == "" || subcommand == "" {
		return fmt.Errorf("evbin: root and subcommand are required")
	}
	all := append([]string{subcommand, "-trimpath"}, args...)
	cmd := exec.CommandContext(ctx, "go", all...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(all, " "), err, b)
	}
	return nil
}
