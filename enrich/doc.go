// Package enrich decides what a Kubernetes Event means for OpenShell: which
// sandbox it belongs to (and by which rule), which role and container it is
// about, which image, whether it is an image-pull failure and why, and which
// gateway progress step it moves. Remedy turns a pull failure's cause into
// the next step for the user (one table, one entry per category).
//
// Besides image pulls (Occurrence.pull_failure), it diagnoses the other
// blockers that keep a sandbox's pod from running (Occurrence.blocker,
// blocker*.go): the scheduler finds no node (FailedScheduling: capacity,
// taints, selectors, affinity, unbound claims), the workspace volume is not
// bound, provisioned, attached or mounted (FailedBinding with no
// StorageClass, ProvisioningFailed, FailedAttachVolume, FailedMount of a
// missing Secret or ConfigMap), the API server refuses the pod (FailedCreate:
// quota, admission webhook, Pod Security, LimitRange), or a container cannot
// start or keeps dying (BackOff restarting, CrashLoopBackOff with the last
// termination's reason, OOMKilled, exit codes, CreateContainerConfigError,
// a terminated container nothing restarts), from Events and, through
// DiagnosePod, from pod statuses. Probe failures and an external
// provisioner's wait are blockers only once they last (ClassifyLasting),
// for a sandbox's objects, and a readiness or startup failure only while
// the cached pod does not show its container ready (or started); the end
// of one is ContainersReady's occurrence, since a probe that passes again
// writes no Event. Every pull failure and blocker carries
// decided_by (text_rule here) and a confidence (certain, likely, weak);
// words the rules do not decide are unrecognised, with the runtime's words
// and no fix (classify.go: rule strengths and the precedence table). Each blocker
// names its kind, cause, object and container, a retrying or persistent
// disposition (a second bounded tracker, like the pull tracker's) and a
// fix. The check is a switch on the Event's reason, so ordinary events pay
// nothing for it. The rules and their held-out score against real messages
// (testdata/blockers) are in bench/diagnosis/blockers.md.
//
// Contract: enrich is pure with respect to I/O. It reads cached metadata
// through the read-only Lookups interfaces, starts no goroutines and never
// blocks. The state is two bounded, mutex-protected trackers (pulls per pod
// and container; blockers per object, container and kind) that count
// failures for the disposition and let a back-off event with no cause
// inherit the cause of the last failure; an Enricher is therefore safe for
// concurrent use. Inputs are untrusted: every
// string in an Occurrence is valid UTF-8 and bounded, and no input panics.
package enrich
