// Package crds holds the CustomResourceDefinitions eventpipe's tests install
// into the test control plane: the Agent Sandbox CRD sandboxes.agents.x-k8s.io
// (v1beta1 storage, v1alpha1 served, status subresource).
//
// That CRD is ours: a minimal schema that also serves v1alpha1, the version
// older OpenShell generations wrote through, so the agent's handling of both
// can be tested. A cluster that runs the real Agent Sandbox controller
// (testenv/kube Writers.AgentSandbox) installs the controller's own CRDs
// instead, with InstallDir: the v1.0.1 CRD serves v1beta1 only and
// validates spec.podTemplate.
//
// Contract: Install creates or updates every embedded CRD and returns only
// when each is Established and every served version answers a list, so a
// caller may create custom resources immediately.
package crds
