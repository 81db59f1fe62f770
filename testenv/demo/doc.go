// Package demo runs the whole eventpipe pipeline on one machine and shows
// what its users see: it is what `make run` runs (testenv/cmd/demo).
//
// Embedded mode (the default): the loopback control plane of testenv/kube
// (etcd + kube-apiserver; built with testenv/build/build.sh on first use,
// showing the build's progress and how long it took) with the components
// that write what eventpipe reads: kube-scheduler, kube-controller-manager,
// the Agent Sandbox controller and one hollow node (a real kubelet with
// eventpipe's CRI, which fails the pulls of the seeds' images as containerd
// does). A collector with its durable log, its file sink and the Follow
// stream (in a temporary data directory) and the agent under the
// least-privilege service-account token the shipped RBAC grants read them.
// The sandboxes of testenv/osdriver's scenarios are created as the
// OpenShell driver creates them (namespace, Sandbox CR, supervisor pod):
// img-missing (the workload image's tag does not exist), sup-bad (the
// supervisor image's tag does not exist), pvc-unbound (the workspace claim
// names no StorageClass and the cluster has none by default, so the pod
// cannot be scheduled), no-cpu, taint, selector (the scheduler cannot place
// the pod) and a healthy sandbox. A live view shows each sandbox's
// diagnosis as `eventpipe diagnose` would print it (which image, workload
// or supervisor, or which other blocker and the object it names, the
// cause, retrying then persistent, the fix) and where the data went (file
// sink path, occurrences per stage and sink, metrics addresses). Nothing
// in this mode is played by testenv/scenario's player: that stays for what
// no real writer here can be driven to do (corpus replay, fault
// injection, bulk load).
//
// Cluster mode (Config.Kubeconfig set): no control plane and no scenarios;
// the agent watches the given cluster with that kubeconfig, read-only
// (list/watch only; leader election is off, so not even a Lease is
// written), and the view shows the sandboxes of Config.Gateway.
//
// Contract:
//   - Run blocks until ctx ends (Ctrl-C) or a component fails, then stops
//     the agent, the view and the collector, then the control plane
//     (SIGTERM, then SIGKILL, waiting until its process groups are empty),
//     and removes the temporary data directory. The control plane's
//     processes also carry Pdeathsig, so they die with the process even
//     when it is killed outright. Nothing outlives Run.
//   - Run never touches a cluster it did not start unless Config.Kubeconfig
//     names one; $KUBECONFIG is not read.
//   - Every listener binds 127.0.0.1 on a free port; the collector requires
//     tokens (an agent token and a reader token, written into the data
//     directory), as a deployed one does.
package demo
