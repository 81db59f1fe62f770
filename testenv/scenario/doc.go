// Package scenario plays OpenShell's Kubernetes objects and the Events the
// kubelet, the scheduler and the Agent Sandbox controller write about them
// (and the persistentvolume-controller's about the workspace PVC) into a real
// kube-apiserver, as they appear on a real cluster, so the agent
// can be tested end to end without a kubelet, a runtime or a registry.
//
// It is our imitation of those writers. Where they can be driven here
// (testenv/kube's writers and hollow nodes, testenv/osdriver: make run and
// the real-writer end-to-end tests) they are used instead; the player stays
// where they cannot: replaying the message corpora (wordings of runtimes
// and registries the hollow node's CRI does not speak), fault injection
// and bulk load.
//
// A Scenario is an ordered list of steps (create a namespace, a Sandbox CR,
// a pod, a PVC; update a pod's or CR's status; write or repeat an Event;
// delete an object) built with a Builder, plus, for every Event it writes,
// an Expectation: what a correct consumer should conclude (sandbox id,
// workspace, role, container, image, image role, pull-failure category),
// using the constants of api/eventpipe/v1. Tests assert against
// Expectations instead of re-deriving OpenShell's naming rules.
//
// Contract:
//   - Play runs the steps in order, against the clients it is given, and
//     returns what it wrote (Result: every Event's namespace, name, UID and
//     final resourceVersion, with its Expectation). It stops at the first
//     error and returns it wrapped with the step it failed at.
//   - Event timestamps follow a virtual clock: step offsets are relative
//     to a base chosen so the last step lands at the moment Play starts, so
//     timestamps are realistic (kubelet back-off spacing) and never in the
//     future, and Play runs as fast as the apiserver accepts writes unless
//     Options.Pace slows it down.
//   - Event names are <object name>.<hex nanoseconds> as client-go's
//     recorders make them; repeats of a kubelet Event update the same
//     object (count, lastTimestamp), repeats of an events.k8s.io Event set
//     series.count and series.lastObservedTime.
//   - Named scenarios (ImageMissing, SupervisorBadTag, ...) take Params;
//     objects are named as OpenShell names them, so two plays of the same
//     scenario in one cluster need different Params.Workspace (or Name).
//   - Pods are deleted with grace period 0 and PVC finalizers are removed,
//     since no kubelet or controller-manager runs in the clusters it plays
//     into.
package scenario
