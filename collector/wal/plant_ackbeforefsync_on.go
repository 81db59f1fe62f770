//go:build plant_ackbeforefsync

package wal

const plantSkipFsync = true
