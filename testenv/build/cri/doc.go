// Package cri is eventpipe's container runtime for the testenv's hollow
// kubelets: a CRI runtime service and image service (k8s.io/cri-api, served
// over gRPC on a unix socket) that run no process and pull no image, but
// answer the kubelet as containerd 2.x or CRI-O would for the behaviour a
// test configures per image reference and per container.
//
// Why ours: the kubelet is real (it writes its own Events, back-offs and pod
// status), but this machine has no container runtime, no registry and no
// network, so the runtime's side is imitated. Its words are not invented:
// every pull failure is one wording of the runtime error vocabulary
// (enrich/testdata/pullvocab/vocab.jsonl), with the gRPC code that runtime
// returns, and the tests check each against its vocabulary line.
//
// Contract:
//   - Config is read from a JSON file (NewFromFile) and read again when the
//     file's modification time changes, so a test can change a node's
//     behaviour while the kubelet runs (a registry that comes back).
//   - A pull with no matching ImageRule succeeds at once. A failing pull
//     returns status.Error(code, message): code Unknown (which the kubelet's
//     CRI client strips, as with the real runtimes) unless the runtime
//     returns another (containerd's NotFound).
//   - A container with no matching ContainerRule runs until stopped; exec
//     commands (exec probes) with no matching ExecRule exit 0.
//   - The server owns its goroutines and timers; Stop ends them.
package cri
