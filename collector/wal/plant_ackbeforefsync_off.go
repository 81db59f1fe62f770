//go:build !plant_ackbeforefsync

package wal

// plantSkipFsync plants a bug for bench/drills (build tag
// plant_ackbeforefsync, never in a product build): appends are reported
// durable, and so acknowledged, without the fsync. Only a power cut shows
// it (the power-cut drill); a SIGKILL keeps the page cache.
const plantSkipFsync = false
