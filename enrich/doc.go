// Package enrich decides what a Kubernetes Event means for OpenShell: which
// sandbox it belongs to (and by which rule), which role and container it is
// about, which image, whether it is an image-pull failure and why, and which
// gateway progress step it moves. Remedy turns a pull failure's cause into
// the next step for the user (one table, one entry per category).
//
// Contract: enrich is pure with respect to I/O. It reads cached metadata
// through the read-only Lookups interfaces, starts no goroutines and never
// blocks. The one piece of state is a bounded, mutex-protected pull tracker
// (per pod and container) that counts failures for the disposition and lets
// a back-off event with no cause inherit the cause of the last failure; an
// Enricher is therefore safe for concurrent use. Inputs are untrusted: every
// string in an Occurrence is valid UTF-8 and bounded, and no input panics.
package enrich
