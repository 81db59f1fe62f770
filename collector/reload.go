package collector

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sort"
	"time"

	"github.com/fsnotify/fsnotify"
)

// reloadDebounce groups the several events an editor's save produces
// (write temp, rename over, chmod) into one reload.
const reloadDebounce = 250 * time.Millisecond

// watchConfig watches the directories of the config file and the tokens
// file (watching the directory survives editors that replace the file by
// rename, and Kubernetes ConfigMap symlink swaps) and reloads on change.
func (c *Collector) watchConfig(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config watcher: %w", err)
	}
	defer w.Close()
	watched := map[string]bool{}
	targets := map[string]bool{}
	add := func(path string) error {
		if path == "" {
			return nil
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return fmt.Errorf("config watcher: %w", err)
		}
		targets[abs] = true
		dir := filepath.Dir(abs)
		if watched[dir] {
			return nil
		}
		if err := w.Add(dir); err != nil {
			return fmt.Errorf("config watcher: watch %s: %w", dir, err)
		}
		watched[dir] = true
		return nil
	}
	if err := add(c.configPath); err != nil {
		return err
	}
	if err := add(c.cfg.Auth.TokensFile); err != nil {
		return err
	}
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			abs, _ := filepath.Abs(ev.Name)
			// ConfigMap volumes swap a ..data symlink: any event in the
			// directory may change what the target resolves to.
			if targets[abs] || filepath.Base(ev.Name) == "..data" {
				timer = time.After(reloadDebounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			c.logger.Warn("config watcher error", "err", err)
		case <-timer:
			timer = nil
			c.reload()
		}
	}
}

// reload re-reads the config file and the tokens file. Sink filters and
// auth (tokens, identities) change in place; open streams keep running
// with their caller's principal. Anything else is logged as requiring a
// restart. An invalid file changes nothing.
func (c *Collector) reload() {
	next, err := LoadConfig(c.configPath)
	if err == nil {
		err = next.Validate()
	}
	if err != nil {
		c.m.reloads.WithLabelValues("failed").Inc()
		c.logger.Error("config reload refused; keeping the running config", "path", c.configPath, "err", err)
		return
	}
	cur := c.cfg

	var tokens []TokenEntry
	if next.Auth.TokensFile != "" {
		if tokens, err = LoadTokens(next.Auth.TokensFile); err != nil {
			c.m.reloads.WithLabelValues("failed").Inc()
			c.logger.Error("tokens reload refused; keeping the running tokens", "err", err)
			return
		}
	}
	// auth.insecure is not switched at run time: that needs a restart.
	newAuth := next.Auth
	newAuth.Insecure = cur.Auth.Insecure
	c.auth.state.Store(newAuthState(newAuth, tokens))
	applied := []string{fmt.Sprintf("auth (%d tokens, %d identities)", len(tokens), len(next.Auth.Identities))}

	byName := map[string]SinkConfig{}
	for _, s := range next.Sinks {
		byName[s.Name] = s
	}
	for i, r := range c.runners {
		s, ok := byName[r.Name()]
		if !ok || reflect.DeepEqual(s.Filter, cur.Sinks[i].Filter) {
			continue
		}
		if err := r.SetFilter(s.Filter); err != nil {
			c.logger.Error("sink filter reload refused", "sink", r.Name(), "err", err)
			continue
		}
		cur.Sinks[i].Filter = s.Filter
		applied = append(applied, "sinks."+r.Name()+".filter")
	}

	restart := restartNeeded(cur, next)
	cur.Auth = newAuth
	c.cfg = cur
	c.m.reloads.WithLabelValues("applied").Inc()
	c.logger.Info("config reloaded", "applied", applied)
	if len(restart) > 0 {
		c.m.reloads.WithLabelValues("restart_required").Inc()
		c.logger.Warn("config change requires restart; not applied until then", "keys", restart)
	}
}

// restartNeeded lists the keys that differ between a and b other than the
// ones reload applies (sink filters, tokens, identities).
func restartNeeded(a, b Config) []string {
	var keys []string
	if !reflect.DeepEqual(a.GRPC, b.GRPC) {
		keys = append(keys, "grpc")
	}
	if a.Auth.Insecure != b.Auth.Insecure {
		keys = append(keys, "auth.insecure")
	}
	if a.Auth.TokensFile != b.Auth.TokensFile {
		keys = append(keys, "auth.tokens_file (the new file is read, but only the old one is watched)")
	}
	if !reflect.DeepEqual(a.HTTP, b.HTTP) {
		keys = append(keys, "http")
	}
	if !reflect.DeepEqual(a.Store, b.Store) {
		keys = append(keys, "store")
	}
	if !reflect.DeepEqual(a.Follow, b.Follow) {
		keys = append(keys, "follow")
	}
	if !reflect.DeepEqual(a.Readiness, b.Readiness) {
		keys = append(keys, "readiness")
	}
	strip := func(ss []SinkConfig) map[string]SinkConfig {
		m := map[string]SinkConfig{}
		for _, s := range ss {
			s.Filter = SinkConfig{}.Filter
			m[s.Name] = s
		}
		return m
	}
	sa, sb := strip(a.Sinks), strip(b.Sinks)
	var changed []string
	for n, s := range sa {
		if t, ok := sb[n]; !ok || !reflect.DeepEqual(s, t) {
			changed = append(changed, "sinks."+n)
		}
	}
	for n := range sb {
		if _, ok := sa[n]; !ok {
			changed = append(changed, "sinks."+n+" (new)")
		}
	}
	sort.Strings(changed)
	return append(keys, changed...)
}
