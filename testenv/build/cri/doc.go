// Package cri is eventpipe's container runtime for the testenv's hollow
// kubelets: a CRI runtime service and image service (k8s.io/cri-api, served
// over gRPC on a unix socket) that pull no image and, but for the
// containers a ProcessRule names, run no process, and answer the kubelet as
// containerd 2.x or CRI-O would for the behaviour a test configures per
// image reference and per container.
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
//     commands (exec probes) with no matching ExecRule exit 0. How a
//     container ends is its rule's when it was created; exec commands are
//     answered by the current config, so a probe can start to pass while
//     the container runs.
//   - A container a ProcessRule matches is a real process: the rule's host
//     executable stands for the image's entrypoint and gets the container's
//     args (and command after its first word) and env. It starts through
//     InitPart (a child of the server's own executable, cloned into new
//     mount and network namespaces): the kubelet's mounts are bound at
//     their container paths, a missing mount point made on a tmpfs mirror
//     of its parent (the host's file system is not written), and lo is up.
//     It runs as the runtime's user (the pod's securityContext is not
//     applied). Its stdout and stderr go to the container's log path in the
//     CRI log format (`kubectl logs` reads it). Its pod's IP becomes
//     127.88.x.y on the host's loopback, where the server proxies each TCP
//     port the pod declares into the namespace (the kubelet's probes reach
//     it). It ends with its own exit status (128+n for signal n);
//     StopContainer sends SIGTERM to its process group, then SIGKILL when
//     the request's timeout passes, and returns once it is reaped;
//     StopPodSandbox and RemoveContainer kill what still runs.
//   - PortForward answers with a URL of the streaming server
//     (k8s.io/cri-streaming, on 127.0.0.1, started by Serve) that carries
//     the stream to 127.0.0.1:port inside the sandbox's running process's
//     network namespace; exec and attach are not served.
//   - The server owns its goroutines, timers and processes; Stop kills the
//     processes (SIGKILL), waits until they are reaped and ends the rest.
package cri
