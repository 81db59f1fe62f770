package sinks

import (
	"errors"
	"fmt"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// BatchConfig says when a runner pushes: as soon as MaxRecords records are
// waiting, or MaxWait after the first record of a batch was read, whichever
// comes first.
type BatchConfig struct {
	MaxRecords int           `json:"max_records" yaml:"max_records"`
	MaxWait    time.Duration `json:"max_wait" yaml:"max_wait"`
}

// RetryConfig shapes the backoff between failed pushes. Retryable errors are
// retried for ever (the data stays in the log and the lag grows, visibly);
// Max caps one wait, not the number of attempts. PushTimeout bounds one
// Push call.
type RetryConfig struct {
	Initial     time.Duration `json:"initial" yaml:"initial"`
	Max         time.Duration `json:"max" yaml:"max"`
	Multiplier  float64       `json:"multiplier" yaml:"multiplier"`
	Jitter      float64       `json:"jitter" yaml:"jitter"`
	PushTimeout time.Duration `json:"push_timeout" yaml:"push_timeout"`
}

// FilterConfig selects the occurrences a sink receives. Every list is an
// exact-match allow list that is ignored when empty; all set conditions must
// hold. The zero value selects everything. Records that do not match advance
// the cursor and are counted as filtered.
type FilterConfig struct {
	// Namespaces: the Event's namespace must be one of these.
	Namespaces []string `json:"namespaces" yaml:"namespaces"`
	// ExcludeNamespaces: the Event's namespace must not be one of these.
	ExcludeNamespaces []string `json:"exclude_namespaces" yaml:"exclude_namespaces"`
	// Types: "Normal", "Warning".
	Types []string `json:"types" yaml:"types"`
	// Reasons: the Event reason (Pulling, Failed, BackOff, ...).
	Reasons []string `json:"reasons" yaml:"reasons"`
	// Workspaces: the sandbox's workspace; unattributed occurrences never
	// match a non-empty list.
	Workspaces []string `json:"workspaces" yaml:"workspaces"`
	// AttributedOnly keeps only occurrences tied to a sandbox.
	AttributedOnly bool `json:"attributed_only" yaml:"attributed_only"`
	// PullFailuresOnly keeps only diagnosed image-pull failures.
	PullFailuresOnly bool `json:"pull_failures_only" yaml:"pull_failures_only"`
}

// RunnerConfig is one sink's shared-layer configuration. Name is the sink's
// configured name: it labels metrics and logs and names its cursor.
type RunnerConfig struct {
	Name   string       `json:"name" yaml:"name"`
	Batch  BatchConfig  `json:"batch" yaml:"batch"`
	Retry  RetryConfig  `json:"retry" yaml:"retry"`
	Filter FilterConfig `json:"filter" yaml:"filter"`
	// CommitInterval is how often, at most, the cursor is committed (a
	// durable write: temp file, fsync, rename) while records flow; it is
	// always committed when the runner catches up with the log or stops
	// cleanly. 0 commits after every push. After a crash the sink delivers
	// again at most this window of records (at-least-once; consumers
	// de-duplicate by event_id).
	CommitInterval time.Duration `json:"commit_interval" yaml:"commit_interval"`
}

// Defaults of RunnerConfig.
const (
	DefaultMaxRecords  = 500
	DefaultMaxWait     = time.Second
	DefaultInitial     = 250 * time.Millisecond
	DefaultMax         = 30 * time.Second
	DefaultMultiplier  = 2.0
	DefaultJitter      = 0.2
	DefaultPushTimeout = 30 * time.Second
	// DefaultCommitInterval: one cursor fsync a second at most, instead of
	// one per push (50-100 a second at 50,000 records/s).
	DefaultCommitInterval = time.Second
	// MaxCommitInterval bounds commit_interval, and with it the replay
	// after a crash.
	MaxCommitInterval = 5 * time.Minute
	// MaxBatchRecords bounds batch.max_records so one batch stays bounded in
	// memory.
	MaxBatchRecords = 100_000
)

// NewDefaultRunnerConfig returns the defaults for a sink called name.
func NewDefaultRunnerConfig(name string) RunnerConfig {
	return RunnerConfig{
		Name:           name,
		CommitInterval: DefaultCommitInterval,
		Batch:          BatchConfig{MaxRecords: DefaultMaxRecords, MaxWait: DefaultMaxWait},
		Retry: RetryConfig{
			Initial:     DefaultInitial,
			Max:         DefaultMax,
			Multiplier:  DefaultMultiplier,
			Jitter:      DefaultJitter,
			PushTimeout: DefaultPushTimeout,
		},
	}
}

// Validate reports every problem, each with its YAML path relative to the
// sink's entry (name, batch.max_records, retry.initial, filter.types, ...).
func (c RunnerConfig) Validate() error {
	var errs []error
	add := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if c.Name == "" {
		add("name", "must not be empty")
	} else if !validName(c.Name) {
		add("name", "%q must use only letters, digits, '-', '_' and '.', at most 64 characters", c.Name)
	}
	if c.Batch.MaxRecords <= 0 || c.Batch.MaxRecords > MaxBatchRecords {
		add("batch.max_records", "must be between 1 and %d, got %d", MaxBatchRecords, c.Batch.MaxRecords)
	}
	if c.Batch.MaxWait <= 0 {
		add("batch.max_wait", "must be positive, got %s", c.Batch.MaxWait)
	}
	if c.Retry.Initial <= 0 {
		add("retry.initial", "must be positive, got %s", c.Retry.Initial)
	}
	if c.Retry.Max < c.Retry.Initial {
		add("retry.max", "must be at least retry.initial (%s), got %s", c.Retry.Initial, c.Retry.Max)
	}
	if c.Retry.Multiplier < 1 {
		add("retry.multiplier", "must be at least 1, got %g", c.Retry.Multiplier)
	}
	if c.Retry.Jitter < 0 || c.Retry.Jitter > 1 {
		add("retry.jitter", "must be between 0 and 1, got %g", c.Retry.Jitter)
	}
	if c.Retry.PushTimeout <= 0 {
		add("retry.push_timeout", "must be positive, got %s", c.Retry.PushTimeout)
	}
	if c.CommitInterval < 0 || c.CommitInterval > MaxCommitInterval {
		add("commit_interval", "must be between 0 (after every push) and %s, got %s", MaxCommitInterval, c.CommitInterval)
	}
	if err := c.Filter.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func validName(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return false
		}
	}
	return true
}

// Validate reports every problem with its YAML path (filter.*).
func (f FilterConfig) Validate() error {
	var errs []error
	check := func(path string, list []string) {
		seen := map[string]bool{}
		for i, v := range list {
			if v == "" {
				errs = append(errs, fmt.Errorf("filter.%s[%d]: must not be empty", path, i))
			} else if seen[v] {
				errs = append(errs, fmt.Errorf("filter.%s[%d]: duplicate %q", path, i, v))
			}
			seen[v] = true
		}
	}
	check("namespaces", f.Namespaces)
	check("exclude_namespaces", f.ExcludeNamespaces)
	check("types", f.Types)
	check("reasons", f.Reasons)
	check("workspaces", f.Workspaces)
	for _, ns := range f.Namespaces {
		for _, ex := range f.ExcludeNamespaces {
			if ns == ex {
				errs = append(errs, fmt.Errorf("filter.exclude_namespaces: %q is also in filter.namespaces", ns))
			}
		}
	}
	return errors.Join(errs...)
}

// filter is a compiled FilterConfig.
type filter struct {
	namespaces, exclude, types, reasons, workspaces map[string]struct{}
	attributedOnly, pullFailuresOnly                bool
}

func set(list []string) map[string]struct{} {
	if len(list) == 0 {
		return nil
	}
	m := make(map[string]struct{}, len(list))
	for _, v := range list {
		m[v] = struct{}{}
	}
	return m
}

func compileFilter(f FilterConfig) *filter {
	return &filter{
		namespaces:       set(f.Namespaces),
		exclude:          set(f.ExcludeNamespaces),
		types:            set(f.Types),
		reasons:          set(f.Reasons),
		workspaces:       set(f.Workspaces),
		attributedOnly:   f.AttributedOnly,
		pullFailuresOnly: f.PullFailuresOnly,
	}
}

func in(m map[string]struct{}, v string) bool {
	_, ok := m[v]
	return ok
}

// Match reports whether the filter selects o. A nil occurrence never
// matches.
func (f FilterConfig) Match(o *eventpipev1.Occurrence) bool {
	return compileFilter(f).match(o)
}

func (f *filter) match(o *eventpipev1.Occurrence) bool {
	if o == nil {
		return false
	}
	if f.namespaces != nil && !in(f.namespaces, o.GetNamespace()) {
		return false
	}
	if in(f.exclude, o.GetNamespace()) {
		return false
	}
	if f.types != nil && !in(f.types, o.GetType()) {
		return false
	}
	if f.reasons != nil && !in(f.reasons, o.GetReason()) {
		return false
	}
	attributed := o.GetSandbox().GetId() != ""
	if f.attributedOnly && !attributed {
		return false
	}
	if f.workspaces != nil && (!attributed || !in(f.workspaces, o.GetSandbox().GetWorkspace())) {
		return false
	}
	if f.pullFailuresOnly && o.GetPullFailure() == nil {
		return false
	}
	return true
}
