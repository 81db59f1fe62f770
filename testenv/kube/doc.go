// Package kube starts a real Kubernetes control plane (etcd + kube-apiserver,
// built by testenv/build) on loopback for tests, benchmarks and the
// dev-cluster command, and hollow nodes (real kubelets) against it.
//
// Contract:
//   - Start (tests) and StartProcess (everything else) find the binaries in
//     $EVENTPIPE_BIN_DIR, else <repo root>/.bin, and build them with
//     testenv/build/build.sh when they are missing, so `go test` alone works.
//   - Both processes listen on free 127.0.0.1 ports only and keep all state in
//     one directory (t.TempDir() for Start). They run in their own process
//     group and die with the test binary (Pdeathsig); Stop (registered with
//     t.Cleanup by Start) sends SIGTERM, then SIGKILL after a grace period, and
//     waits, so no process outlives the cluster even when a test fails.
//   - A port picked free can be taken by another process before etcd or
//     kube-apiserver binds it: Start then starts again on new ports (three
//     tries), and an answer on etcd's port counts only once this etcd has
//     logged that it serves it (another test's etcd could answer first).
//   - A started Cluster is ready: /readyz answered 200, the agent's RBAC from
//     deploy/agent/rbac.yaml is applied with its namespace and service
//     account, and the Agent Sandbox CRDs (testenv/crds) are Established.
//   - WithWriters (opt-in: most tests need only the apiserver) also starts
//     the components that write Events and statuses: kube-scheduler,
//     kube-controller-manager (ControllerManagerControllers: volume binding,
//     namespaces, quota, garbage collection, service accounts and tokens,
//     StatefulSets;
//     with it ServiceAccount admission is on; the node lifecycle controller
//     lifts a hollow node's not-ready taint once its kubelet reports Ready,
//     and taints a node whose kubelet stopped) and the Agent Sandbox
//     controller, whose own CRDs then replace testenv/crds'. Each runs with
//     leader election off, as a child like the others, and is ready when
//     its health endpoint answers (the controller-manager: once the default
//     namespace has its service account). Stop stops them first. The pods
//     they place run on hollow nodes (AddNode).
//   - AdminConfig is system:masters; AgentConfig authenticates as the
//     service account user system:serviceaccount:eventpipe:eventpipe-agent
//     (a static token), so it has exactly the permissions the agent ships.
//   - Compact forces an etcd compaction at the current revision: afterwards
//     a watch or exact list of an un-watch-cached resource (Events) from an
//     older resourceVersion answers 410 Gone.
//   - AddNode starts a hollow node: a real kubelet (kubeparts hollow-kubelet,
//     testenv/build) whose Events, back-offs, volume mounts, probes and pod
//     status are the kubelet's own, with eventpipe's CRI (testenv/build/cri)
//     behind its socket, because no container runtime, registry or network
//     exists here; the CRI answers in containerd 2.x's (or CRI-O's) words for
//     the pull outcomes and container behaviours the node's RuntimeConfig
//     names; containers a ProcessRule names run as real processes (see the
//     cri package). The kubelet serves (HTTPS, self-signed, no client
//     authentication or authorization: test-only, on 127.0.0.1) on a port of
//     its own and the Node's InternalIP is 127.0.0.1, which kube-apiserver
//     prefers (--kubelet-preferred-address-types), so `kubectl logs` and
//     `kubectl port-forward` reach it. The node is Ready when AddNode
//     returns and stops with the cluster (its CRI kills the processes it
//     started). Node.SetRuntime changes the behaviour of a running node.
//   - Cluster methods are safe for concurrent use, except that
//     RestartAPIServer and Stop must not race each other.
package kube
