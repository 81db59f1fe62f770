//go:build !plant_offsetreuse

package wal

// plantReuseOffsets plants a bug for bench/drills (build tag
// plant_offsetreuse, never in a product build): after a tail repair the
// next record reuses the offsets the repair skipped. bench/drills.md lists
// the drills that must fail on it.
const plantReuseOffsets = false
