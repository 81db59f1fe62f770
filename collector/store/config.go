package store

import (
	"errors"
	"fmt"
	"time"
)

// Config is what a user writes under the collector's `store:` key.
type Config struct {
	// Dir is the data directory (log segments, checkpoints, cursors).
	Dir string `json:"dir" yaml:"dir"`
	// SegmentBytes: size at which the log starts a new segment file.
	SegmentBytes int64 `json:"segment_bytes" yaml:"segment_bytes"`
	// Retention bounds the log by size and age (whole segments).
	Retention RetentionConfig `json:"retention" yaml:"retention"`
	// DedupeWindow: an event_id stored within this window is not stored
	// again (at least the Kubernetes event TTL, 1h).
	DedupeWindow time.Duration `json:"dedupe_window" yaml:"dedupe_window"`
	// DedupeMaxEntries bounds the dedupe index (about 80 bytes per entry);
	// past it the oldest ids are evicted early, counted and logged.
	DedupeMaxEntries int `json:"dedupe_max_entries" yaml:"dedupe_max_entries"`
	// Fsync: false skips fsync (tests and benchmarks only: acknowledged data
	// can then be lost on power failure).
	Fsync bool `json:"fsync" yaml:"fsync"`
	// MaxInflightBytes bounds the bytes of batches waiting for their group
	// commit; Append blocks above it (the collector's flow control).
	MaxInflightBytes int64 `json:"max_inflight_bytes" yaml:"max_inflight_bytes"`
	// AcceptDataLoss lets the store open a log in which acknowledged
	// records are damaged or missing (a flipped byte, a disk that lost
	// fsynced data): the intact records are kept, the lost ones counted
	// (eventpipe_collector_log_data_loss_records_total) and logged at ERROR.
	// When false (the default) the store refuses to open such a log and
	// leaves it untouched, so the operator can copy it before deciding. Set
	// it for one start, then remove it again.
	AcceptDataLoss bool `json:"accept_data_loss" yaml:"accept_data_loss"`
}

// RetentionConfig bounds the log. Zero means no bound of that kind.
type RetentionConfig struct {
	MaxBytes int64         `json:"max_bytes" yaml:"max_bytes"`
	MaxAge   time.Duration `json:"max_age" yaml:"max_age"`
}

// Defaults.
const (
	DefaultSegmentBytes     int64 = 64 << 20
	DefaultMaxBytes         int64 = 10 << 30
	DefaultMaxAge                 = 168 * time.Hour
	DefaultDedupeWindow           = time.Hour
	DefaultDedupeMaxEntries       = 4_000_000
	DefaultMaxInflightBytes int64 = 64 << 20
	minSegmentBytes         int64 = 4 << 10
)

// NewDefaultConfig returns the defaults; Dir must still be set.
func NewDefaultConfig() Config {
	return Config{
		Dir:              "/var/lib/eventpipe",
		SegmentBytes:     DefaultSegmentBytes,
		Retention:        RetentionConfig{MaxBytes: DefaultMaxBytes, MaxAge: DefaultMaxAge},
		DedupeWindow:     DefaultDedupeWindow,
		DedupeMaxEntries: DefaultDedupeMaxEntries,
		Fsync:            true,
		MaxInflightBytes: DefaultMaxInflightBytes,
	}
}

// Validate reports every problem, each with its YAML path relative to the
// storage block (the caller prefixes its own key).
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("dir: must be set"))
	}
	if c.SegmentBytes < minSegmentBytes {
		errs = append(errs, fmt.Errorf("segment_bytes: %d is below the minimum %d", c.SegmentBytes, minSegmentBytes))
	}
	if c.Retention.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("retention.max_bytes: %d must not be negative (0 = unbounded)", c.Retention.MaxBytes))
	} else if c.Retention.MaxBytes > 0 && c.Retention.MaxBytes < 2*c.SegmentBytes {
		errs = append(errs, fmt.Errorf("retention.max_bytes: %d must be at least twice segment_bytes (%d)", c.Retention.MaxBytes, c.SegmentBytes))
	}
	if c.Retention.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("retention.max_age: %s must not be negative (0 = unbounded)", c.Retention.MaxAge))
	}
	if c.DedupeWindow <= 0 {
		errs = append(errs, fmt.Errorf("dedupe_window: %s must be positive", c.DedupeWindow))
	}
	if c.Retention.MaxAge > 0 && c.DedupeWindow > c.Retention.MaxAge {
		errs = append(errs, fmt.Errorf("dedupe_window: %s must not exceed retention.max_age (%s): the index is rebuilt from the log", c.DedupeWindow, c.Retention.MaxAge))
	}
	if c.DedupeMaxEntries <= 0 {
		errs = append(errs, fmt.Errorf("dedupe_max_entries: %d must be positive", c.DedupeMaxEntries))
	}
	if c.MaxInflightBytes <= 0 {
		errs = append(errs, fmt.Errorf("max_inflight_bytes: %d must be positive", c.MaxInflightBytes))
	}
	return errors.Join(errs...)
}
