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
	if root == "" || out == "" {
		return fmt.Errorf("evbin: root and out are required")
	}
	args := append([]string{"build", "-trimpath"}, extra...)
	args = append(args, "-o", out, Package)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}
