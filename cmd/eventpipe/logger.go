//go:build !agentonly

package main

import (
	"fmt"
	"io"
	"log/slog"
)

// newLogger builds the logger of the collector and the driver proxy from
// their --log-level and --log-format flags. It prints the problem, prefixed
// with the command's name, and returns false when a flag is wrong.
func newLogger(stderr io.Writer, command, level, format string) (*slog.Logger, bool) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintf(stderr, "eventpipe %s: --log-level: %v\n", command, err)
		return nil, false
	}
	hopts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, hopts)), true
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, hopts)), true
	}
	fmt.Fprintf(stderr, "eventpipe %s: --log-format must be text or json, got %q\n", command, format)
	return nil, false
}
