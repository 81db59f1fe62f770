//go:build plant_nodedupe

package store

const plantNoDedupe = true
