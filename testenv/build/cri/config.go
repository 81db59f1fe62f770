package cri

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Runtime flavours: whose words and gRPC codes a failing pull carries.
const (
	Containerd = "containerd" // containerd 2.x (the default)
	CRIO       = "cri-o"      // CRI-O 1.3x
)

// Pull outcomes an ImageRule can ask for.
const (
	PullOK                = "ok"
	PullNotFound          = "not_found"          // the tag does not exist
	PullUnauthorized      = "unauthorized"       // the registry refuses an anonymous pull
	PullRateLimited       = "rate_limited"       // 429 Too Many Requests
	PullTLS               = "tls"                // certificate signed by an unknown authority
	PullDNS               = "dns"                // the registry's name does not resolve
	PullConnectionRefused = "connection_refused" // nothing listens on the registry's port
	PullIOTimeout         = "io_timeout"         // the registry's address does not answer
	PullPlatformMismatch  = "platform_mismatch"  // no manifest for the node's platform
)

var pullOutcomes = []string{PullOK, PullNotFound, PullUnauthorized, PullRateLimited, PullTLS, PullDNS,
	PullConnectionRefused, PullIOTimeout, PullPlatformMismatch}

// Config is one node's runtime behaviour (the JSON file the hollow kubelet
// is started with). Rules are tried in order; the first match applies.
type Config struct {
	// Runtime is Containerd (default) or CRIO.
	Runtime string `json:"runtime,omitempty"`
	// Images says how pulls of matching references end.
	Images []ImageRule `json:"images,omitempty"`
	// Containers says how matching containers behave once started.
	Containers []ContainerRule `json:"containers,omitempty"`
	// Processes says which containers run as real processes.
	Processes []ProcessRule `json:"processes,omitempty"`
}

// ImageRule matches a pull by its reference, as the pod spec writes it or
// normalised (busybox:1 and docker.io/library/busybox:1 are one image).
type ImageRule struct {
	Image string `json:"image"`
	// Pull is one of the Pull* outcomes; empty means PullOK.
	Pull string `json:"pull,omitempty"`
	// Delay passes before the pull answers (a slow registry, a large image).
	Delay Duration `json:"delay,omitempty"`
	// Addr is the registry address a network failure names (dial tcp
	// <addr>: ...); default 10.20.30.40:<the reference's port or 443>.
	Addr string `json:"addr,omitempty"`
	// Platform is the node platform a platform mismatch names; default
	// linux/amd64.
	Platform string `json:"platform,omitempty"`
}

// ContainerRule matches a container; empty fields match anything.
type ContainerRule struct {
	Namespace string `json:"namespace,omitempty"`
	// Pod is the pod name, or a prefix when it ends in "*".
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Image     string `json:"image,omitempty"`

	// ExitAfter is how long the container runs before its process exits
	// (every start, so a restarting container crash-loops); 0 means it
	// runs until the kubelet stops it.
	ExitAfter Duration `json:"exitAfter,omitempty"`
	// ExitCode of that exit (0: Completed, else Error).
	ExitCode int32 `json:"exitCode,omitempty"`
	// OOMKilled makes that exit the kernel's OOM kill: exit code 137 and
	// reason OOMKilled, as containerd and CRI-O report it.
	OOMKilled bool `json:"oomKilled,omitempty"`
	// Exec answers commands run in the container (exec probes).
	Exec []ExecRule `json:"exec,omitempty"`
}

// ProcessRule makes matching containers real processes; its match fields
// are ContainerRule's (Image may end in "*": a prefix). A container a ProcessRule matches ignores the
// ContainerRules' exits (it ends when its process does); their Exec
// answers still apply.
type ProcessRule struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Image     string `json:"image,omitempty"`
	// Run is a host executable (absolute path) that stands for the
	// image's entrypoint: the container runs it with the container's args
	// (and its command after the first word) and environment, the
	// kubelet's mounts at their container paths (a mount namespace of its
	// own) and a network namespace of its own (only lo: its ports are
	// reached at the pod's IP, 127.88.x.y on the host's loopback, and by
	// port-forward), as the runtime's user (root here, whatever the pod's
	// securityContext says).
	Run string `json:"run"`
}

// ExecRule answers an exec whose command starts with Command.
type ExecRule struct {
	Command  []string `json:"command"`
	ExitCode int32    `json:"exitCode,omitempty"`
	Stdout   string   `json:"stdout,omitempty"`
	Stderr   string   `json:"stderr,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("1.5s").
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"1.5s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	d.Duration = v
	return nil
}

// ParseConfig reads a Config strictly (unknown fields are errors, so a
// misspelt rule fails the node's start instead of being ignored) and
// validates it.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("parse runtime config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate reports every problem, each with its JSON path.
func (c *Config) Validate() error {
	var errs []error
	switch c.Runtime {
	case "", Containerd, CRIO:
	default:
		errs = append(errs, fmt.Errorf("runtime: %q is not %q or %q", c.Runtime, Containerd, CRIO))
	}
	for i, r := range c.Images {
		if r.Image == "" {
			errs = append(errs, fmt.Errorf("images[%d].image: required", i))
		} else if _, err := parseRef(r.Image); err != nil {
			errs = append(errs, fmt.Errorf("images[%d].image: %w", i, err))
		}
		if r.Pull != "" && !contains(pullOutcomes, r.Pull) {
			errs = append(errs, fmt.Errorf("images[%d].pull: %q is not one of %s", i, r.Pull, strings.Join(pullOutcomes, ", ")))
		}
		if r.Delay.Duration < 0 {
			errs = append(errs, fmt.Errorf("images[%d].delay: negative", i))
		}
		if r.Platform != "" && strings.Count(r.Platform, "/") < 1 {
			errs = append(errs, fmt.Errorf("images[%d].platform: %q is not os/arch[/variant]", i, r.Platform))
		}
	}
	for i, r := range c.Containers {
		if r.ExitAfter.Duration < 0 {
			errs = append(errs, fmt.Errorf("containers[%d].exitAfter: negative", i))
		}
		if r.OOMKilled && r.ExitAfter.Duration == 0 {
			errs = append(errs, fmt.Errorf("containers[%d].oomKilled: needs exitAfter (when the kill comes)", i))
		}
		for j, e := range r.Exec {
			if len(e.Command) == 0 {
				errs = append(errs, fmt.Errorf("containers[%d].exec[%d].command: required", i, j))
			}
		}
	}
	for i, r := range c.Processes {
		if !filepath.IsAbs(r.Run) {
			errs = append(errs, fmt.Errorf("processes[%d].run: %q is not an absolute path", i, r.Run))
		}
	}
	return errors.Join(errs...)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// runtimeName is the flavour, defaulted.
func (c *Config) runtimeName() string {
	if c.Runtime == "" {
		return Containerd
	}
	return c.Runtime
}

// imageRule returns the first rule for ref (as written or normalised).
func (c *Config) imageRule(ref string) (ImageRule, bool) {
	norm := ref
	if r, err := parseRef(ref); err == nil {
		norm = r.normalized()
	}
	for _, r := range c.Images {
		if r.Image == ref || r.Image == norm {
			return r, true
		}
		if p, err := parseRef(r.Image); err == nil && p.normalized() == norm {
			return r, true
		}
	}
	return ImageRule{}, false
}

// containerRule returns the first rule matching a container.
func (c *Config) containerRule(namespace, pod, container, image string) (ContainerRule, bool) {
	for _, r := range c.Containers {
		if matches(r.Namespace, r.Pod, r.Container, r.Image, namespace, pod, container, image) {
			return r, true
		}
	}
	return ContainerRule{}, false
}

// processRun returns the executable of the first ProcessRule matching a
// container, "" if none does.
func (c *Config) processRun(namespace, pod, container, image string) string {
	for _, r := range c.Processes {
		if matches(r.Namespace, r.Pod, r.Container, r.Image, namespace, pod, container, image) {
			return r.Run
		}
	}
	return ""
}

// matches: a rule's fields (empty: any; pod ending in "*": a prefix)
// against a container.
func matches(rNamespace, rPod, rContainer, rImage, namespace, pod, container, image string) bool {
	switch {
	case rNamespace != "" && rNamespace != namespace,
		rPod != "" && !(rPod == pod || strings.HasSuffix(rPod, "*") && strings.HasPrefix(pod, strings.TrimSuffix(rPod, "*"))),
		rContainer != "" && rContainer != container,
		rImage != "" && !sameImage(rImage, image):
		return false
	}
	return true
}

// sameImage: a rule's image names a container's reference, as written or
// normalised; ending in "*" it is a prefix of either
// (ghcr.io/eventpipe/eventpipe:* for every tag).
func sameImage(rule, image string) bool {
	if p, ok := strings.CutSuffix(rule, "*"); ok {
		if strings.HasPrefix(image, p) {
			return true
		}
		r, err := parseRef(image)
		return err == nil && strings.HasPrefix(r.normalized(), p)
	}
	return sameRef(rule, image)
}

func sameRef(a, b string) bool {
	if a == b {
		return true
	}
	ra, err1 := parseRef(a)
	rb, err2 := parseRef(b)
	return err1 == nil && err2 == nil && ra.normalized() == rb.normalized()
}

// execRule returns the answer to cmd.
func (r *ContainerRule) execRule(cmd []string) (ExecRule, bool) {
	for _, e := range r.Exec {
		if len(cmd) >= len(e.Command) && equal(cmd[:len(e.Command)], e.Command) {
			return e, true
		}
	}
	return ExecRule{}, false
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// configFile holds a Config read from a file, read again when the file's
// modification time or size changes.
type configFile struct {
	path    string
	modTime time.Time
	size    int64
	cfg     Config
}

func loadConfigFile(path string) (*configFile, error) {
	f := &configFile{path: path}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// reload reads the file when it changed. A file that became invalid keeps
// the last good Config and returns the error (the caller logs it).
func (f *configFile) reload() error {
	st, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("runtime config: %w", err)
	}
	if st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("runtime config: %w", err)
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	f.cfg, f.modTime, f.size = cfg, st.ModTime(), st.Size()
	return nil
}
