// Package osdriver creates, on a test control plane, the objects the
// OpenShell Kubernetes driver creates for a sandbox: the workspace's
// namespace (managed mode; shared and operator namespaces are made as an
// operator would), the Sandbox custom resource with the pod template and
// workspace claim template the driver writes, and the newer generation's
// bare supervisor pod os-supervisor-<id>. Names and labels follow
// testenv/scenario's Sandbox, which derives them as OpenShell does.
//
// It exists because the driver and the gateway are Rust (NVIDIA/OpenShell)
// and cannot be built here. Everything downstream of these objects is the
// real thing when the cluster runs testenv/kube's Writers: the Agent
// Sandbox controller creates the workload pod and the claim from the CR and
// writes the CR's conditions, kube-scheduler places (or cannot place) both
// pods, kube-controller-manager binds claims and enforces quota, and a
// kubelet, where one runs, pulls the images. Nothing here writes an Event
// or a status. Scenario webhook plays a cluster's policy: a validating
// admission webhook server in this process (kube.DenyWebhook) that the
// API server calls for the sandbox's workload pod; the Driver owns it
// until Close.
//
// Contract: Create is idempotent per sandbox (objects that exist are left
// as they are) and retries what the driver's own reconcile loop would
// retry: a pod refused because its namespace's default service account is
// not made yet.
package osdriver
