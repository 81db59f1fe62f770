// Package e2e holds the driver proxy's end-to-end tests: the real
// kube-apiserver (testenv/kube) with the seed scenarios played into it
// (testenv/scenario), or with its real writers (scheduler,
// controller-manager, the Agent Sandbox controller, a hollow kubelet) and
// every scenario of testenv/osdriver; the real agent, the real collector,
// the proxy, the test driver and a gateway-side client
// (sinks/gateway/gatewaytest). It is a package of its own so the proxy's
// unit tests do not link the agent and client-go.
package e2e
