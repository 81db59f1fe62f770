// Package hollowload is the benchmarks' one way of producing load from the
// components that write Events on a real cluster: hollow nodes (the real
// kubelet v1.37.2 with eventpipe's CRI, testenv/kube AddNode) whose
// runtime fails every pull of the missing workload image as containerd 2.x
// does, and pods with that image placed on them by kube-scheduler, either
// bare (Pods) or as the workload pods of sandboxes that the Agent Sandbox
// controller creates from the CRs the OpenShell driver would write
// (Sandboxes). The cluster must run every writer (kube.AllWriters).
//
// The kubelets then write Pulling, Failed and BackOff with their own
// back-off and their event correlator: a repeat bumps the count of one
// Event object instead of creating another, so the load is a few thousand
// Event objects and a few updates per pod per minute, not a stream of new
// objects. Describe sums a listing by writer and reason so a page can say
// what the load was.
package hollowload
