//go:build plant_offsetreuse

package wal

const plantReuseOffsets = true
