// Package crds holds the CustomResourceDefinitions eventpipe's tests install
// into the test control plane: the Agent Sandbox CRD sandboxes.agents.x-k8s.io
// (v1beta1 storage, v1alpha1 served, status subresource).
//
// Contract: Install creates or updates every embedded CRD and returns only
// when each is Established and every served version answers a list, so a
// caller may create custom resources immediately.
package crds
