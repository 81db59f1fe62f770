//go:build !plant_nodedupe

package store

// plantNoDedupe plants a bug for bench/drills (build tag plant_nodedupe,
// never in a product build): an occurrence already in the log is stored
// again. bench/drills.md lists the drills that must fail on it.
const plantNoDedupe = false
