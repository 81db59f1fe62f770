//go:build !drill_syncjournal

package store

import "github.com/eventpipe/eventpipe/collector/wal"

// defaultFS is the file system a store uses unless a test injects one: the
// real one. (bench/drills builds with drill_syncjournal, fs_syncjournal.go.)
func defaultFS() wal.FS { return wal.OSFS{} }
