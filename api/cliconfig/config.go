package cliconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Context is one named way to reach a collector.
type Context struct {
	Collector  string `yaml:"collector,omitempty"`
	CA         string `yaml:"ca,omitempty"`
	TokenFile  string `yaml:"token-file,omitempty"`
	ServerName string `yaml:"server-name,omitempty"`
	Insecure   bool   `yaml:"insecure,omitempty"`
}

// File is the context file.
type File struct {
	CurrentContext string             `yaml:"current-context,omitempty"`
	Contexts       map[string]Context `yaml:"contexts,omitempty"`
}

// Path is where the context file lives: $XDG_CONFIG_HOME/eventpipe/config.yaml,
// else ~/.config/eventpipe/config.yaml (the XDG default).
func Path(getenv func(string) string) (string, error) {
	if dir := getenv("XDG_CONFIG_HOME"); dir != "" {
		return filepath.Join(dir, "eventpipe", "config.yaml"), nil
	}
	home := getenv("HOME")
	if home == "" {
		return "", errors.New("neither XDG_CONFIG_HOME nor HOME is set: cannot place the context file")
	}
	return filepath.Join(home, ".config", "eventpipe", "config.yaml"), nil
}

// Load reads the context file; a file that does not exist is an empty one.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &File{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read context file: %w", err)
	}
	var f File
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("context file %s: %w", path, err)
	}
	if f.CurrentContext != "" {
		if _, ok := f.Contexts[f.CurrentContext]; !ok {
			return nil, fmt.Errorf("context file %s: current-context %q is not among its contexts %v", path, f.CurrentContext, f.Names())
		}
	}
	return &f, nil
}

// Save writes the file with mode 0600 (it names token files and may be
// shared by nobody), atomically: a temporary file renamed over the old one.
func (f *File) Save(path string) error {
	b, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode context file: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("save context file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("save context file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("save context file: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("save context file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save context file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save context file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save context file: %w", err)
	}
	return nil
}

// Names lists the contexts, sorted.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.Contexts))
	for n := range f.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Settings are the resolved connection settings.
type Settings struct {
	Collector  string
	CA         string
	TokenFile  string
	ServerName string
	Insecure   bool
}

// Source is what Resolve chooses from.
type Source struct {
	// Flags holds the connection flags given on the command line, by flag
	// name (collector, ca, token-file, server-name, insecure); a flag not
	// given is absent.
	Flags map[string]string
	// Getenv reads the environment (os.Getenv).
	Getenv func(string) string
	// File is the context file (nil: none).
	File *File
	// Context names the context to use instead of the file's current one.
	Context string
	// DefaultCollector is the address when no source names one.
	DefaultCollector string
}

// Environment variables, by the flag they stand for.
var envNames = map[string]string{
	"collector":  "EVENTPIPE_COLLECTOR",
	"ca":         "EVENTPIPE_CA",
	"token-file": "EVENTPIPE_TOKEN_FILE",
	"insecure":   "EVENTPIPE_INSECURE",
}

// EnvName is the environment variable standing for a flag ("" for none).
func EnvName(flag string) string { return envNames[flag] }

// groups of settings decided together (see the package doc).
var groups = [][]string{{"collector", "server-name"}, {"ca", "insecure"}, {"token-file"}}

// Resolve applies flag > environment > context > default per group.
func Resolve(src Source) (Settings, error) {
	getenv := src.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	ctx, err := src.context()
	if err != nil {
		return Settings{}, err
	}
	fromCtx := map[string]string{
		"collector": ctx.Collector, "ca": ctx.CA, "token-file": ctx.TokenFile, "server-name": ctx.ServerName,
	}
	if ctx.Insecure {
		fromCtx["insecure"] = "true"
	}
	fromEnv := map[string]string{}
	for flag, env := range envNames {
		if v := getenv(env); v != "" {
			fromEnv[flag] = v
		}
	}
	values := map[string]string{}
	for _, g := range groups {
		for _, layer := range []map[string]string{src.Flags, fromEnv, fromCtx} {
			if !anySet(layer, g) {
				continue
			}
			for _, k := range g {
				if v, ok := layer[k]; ok {
					values[k] = v
				}
			}
			break
		}
	}
	s := Settings{Collector: values["collector"], CA: values["ca"], TokenFile: values["token-file"], ServerName: values["server-name"]}
	if s.Collector == "" {
		s.Collector = src.DefaultCollector
	}
	if v, ok := values["insecure"]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			where := "--insecure"
			if _, flagged := src.Flags["insecure"]; !flagged {
				where = envNames["insecure"]
			}
			return Settings{}, fmt.Errorf("%s: want true or false, got %q", where, v)
		}
		s.Insecure = b
	}
	return s, nil
}

func anySet(layer map[string]string, keys []string) bool {
	for _, k := range keys {
		if _, ok := layer[k]; ok {
			return true
		}
	}
	return false
}

// context is the context in use: the one named by Source.Context, else the
// file's current one, else none.
func (src Source) context() (Context, error) {
	if src.File == nil {
		if src.Context != "" {
			return Context{}, fmt.Errorf("context %q: there is no context file", src.Context)
		}
		return Context{}, nil
	}
	name := src.Context
	if name == "" {
		name = src.File.CurrentContext
	}
	if name == "" {
		return Context{}, nil
	}
	c, ok := src.File.Contexts[name]
	if !ok {
		return Context{}, fmt.Errorf("no context %q (have %v)", name, src.File.Names())
	}
	return c, nil
}
