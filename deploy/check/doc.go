// Package check holds the checks of eventpipe's deployment files, kept in
// their own module so that Helm, kubeconform and the Prometheus parser stay
// out of the main go.mod:
//
//   - the Helm chart (deploy/helm/eventpipe): helm lint --strict; helm
//     template with the default values and with every optional part on,
//     validated by kubeconform (strict, with schemas generated from the test
//     kube-apiserver's OpenAPI) and applied with a server-side dry-run to that
//     kube-apiserver; values.schema.json refuses wrong values;
//   - the raw manifests in deploy/agent and deploy/collector are the chart's
//     output (make manifests writes them; a test fails when they are stale);
//   - the agent's RBAC: the rules the chart grants equal the requests a real
//     agent makes (kube-apiserver audit log);
//   - the PrometheusRule and the Grafana dashboard: every expression parses
//     and names only metrics eventpipe exports.
//   - the docs test (TestDocsCommandsRun): the README's by-hand block and
//     enrich pipe run as printed on the control plane of `make
//     dev-cluster`, and the chart's NOTES (installed there with helm, TLS on
//     and off) run as printed, the port-forward to the chart's collector
//     pod among them (its container a real process on the dev-cluster's
//     hollow node; see the test);
//
// make chart-check builds helm and kubeconform into .bin and runs these
// tests; docs/contributing.md describes the test infrastructure.
package check
