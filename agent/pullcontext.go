package agent

import (
	"strings"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/remedy"
)

// Cluster-context rules for image pulls: what the cluster says around a
// pull failure decides what the failure's words cannot. They run in the
// processor on occurrences enrich has already diagnosed (no API call: only
// Events the agent watches anyway), and change a diagnosis in the same
// fields (decided_by cluster_context).
//
// Rule "missing pull secret": the kubelet reports FailedToRetrieveImagePullSecret
// ("Unable to retrieve some image pull secrets (regcred); attempting to pull
// the image may not succeed.", kubelet 1.28+) for a pod whose imagePullSecrets
// name a Secret it cannot read, and then pulls without it. A later failure of
// that pod whose words cannot tell a missing image from missing credentials
// (not_found_or_unauthorized, unknown, unrecognised) within
// pullContextTTL is unauthorized: the pull went out without the credentials
// the pod asked for. Confidence likely: the image may be missing too. A
// failure the kubelet reported before the warning is not changed (the watch
// gives no order across a pod's Events; its next retry is).
//
// Rule "pulled elsewhere": another pod of the cluster pulled the same image
// ("Successfully pulled image ...", not "already present", which proves
// nothing about the registry) within pulledTTL. A failure whose words cannot
// tell a missing image from missing credentials (not_found_or_unauthorized)
// is then unauthorized, likely: the image exists, and this pod's pull lacks
// credentials that work (its imagePullSecrets, its service account's, or the
// node's). Its detail names the pod and node that pulled it.

const (
	reasonMissingPullSecret = "FailedToRetrieveImagePullSecret"
	pullContextTTL          = 10 * time.Minute
	pullContextMax          = 4096
	pulledTTL               = 30 * time.Minute
)

type pulledBy struct {
	pod, node string
	at        time.Time
}

type missingSecrets struct {
	names string // as the kubelet lists them: "a, b"
	at    time.Time
}

// pullContext remembers, per pod, the pull secrets the kubelet could not
// read. Bounded (pullContextMax pods; the oldest go first); processor
// goroutine only.
type pullContext struct {
	pods   map[string]missingSecrets // namespace/pod
	order  []string
	pulled map[string]pulledBy // image (normalised) -> the last pod that pulled it
	porder []string
}

func newPullContext() *pullContext {
	return &pullContext{pods: map[string]missingSecrets{}, pulled: map[string]pulledBy{}}
}

// imageKey normalises a reference the way the runtime resolves it.
func imageKey(image string) string {
	r := remedy.ParseImageRef(image)
	return r.Registry + "/" + r.Repository + ":" + r.Tag + "@" + r.Digest
}

// apply records a FailedToRetrieveImagePullSecret occurrence, or applies the
// rule to a pull failure; it reports whether it changed o's diagnosis.
func (c *pullContext) apply(o *eventpipev1.Occurrence, now time.Time) bool {
	obj := o.GetInvolvedObject()
	if obj.GetKind() != "Pod" {
		return false
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	if o.GetReason() == reasonMissingPullSecret {
		names := o.GetMessage()
		if i, j := strings.Index(names, "("), strings.Index(names, ")"); i >= 0 && j > i {
			names = names[i+1 : j]
		}
		if _, ok := c.pods[key]; !ok {
			c.order = append(c.order, key)
		}
		c.pods[key] = missingSecrets{names: names, at: now}
		for len(c.order) > pullContextMax {
			delete(c.pods, c.order[0])
			c.order = c.order[1:]
		}
		return false
	}
	if o.GetReason() == "Pulled" && strings.HasPrefix(o.GetMessage(), "Successfully pulled image") && o.GetImage() != "" {
		k := imageKey(o.GetImage())
		if _, ok := c.pulled[k]; !ok {
			c.porder = append(c.porder, k)
		}
		c.pulled[k] = pulledBy{pod: key, node: o.GetReportingInstance(), at: now}
		for len(c.porder) > pullContextMax {
			delete(c.pulled, c.porder[0])
			c.porder = c.porder[1:]
		}
		return false
	}
	pf := o.GetPullFailure()
	if pf == nil || pf.GetDecidedBy() == eventpipev1.DecidedByRegistry {
		return false
	}
	if c.pulledElsewhere(key, pf, now) {
		return true
	}
	switch pf.GetCategory() {
	case eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.CategoryUnknown, eventpipev1.CategoryUnrecognised:
	default:
		return false
	}
	m, ok := c.pods[key]
	if !ok || now.Sub(m.at) > pullContextTTL {
		return false
	}
	pf.Category = eventpipev1.CategoryUnauthorized
	pf.DecidedBy, pf.Confidence = eventpipev1.DecidedByClusterContext, eventpipev1.ConfidenceLikely
	words := "the kubelet could not retrieve the pod's image pull secret(s) " + m.names + " (" + reasonMissingPullSecret + ") and pulled without them"
	if pf.GetDetail() != "" {
		words = pf.GetDetail() + "; " + words
	}
	pf.Detail = words
	return true
}

// pulledElsewhere applies the rule "pulled elsewhere" to pf, a failure of
// pod key.
func (c *pullContext) pulledElsewhere(key string, pf *eventpipev1.PullFailure, now time.Time) bool {
	if pf.GetCategory() != eventpipev1.CategoryNotFoundOrUnauthorized || pf.GetImage() == "" {
		return false
	}
	by, ok := c.pulled[imageKey(pf.GetImage())]
	if !ok || by.pod == key || now.Sub(by.at) > pulledTTL {
		return false
	}
	on := ""
	if by.node != "" {
		on = " on node " + by.node
	}
	pf.Category = eventpipev1.CategoryUnauthorized
	pf.DecidedBy, pf.Confidence = eventpipev1.DecidedByClusterContext, eventpipev1.ConfidenceLikely
	words := "pod " + by.pod + on + " pulled the same image at " + by.at.UTC().Format(time.RFC3339) +
		", so it exists: this pod's pull lacks credentials that work (its imagePullSecrets, its service account's, or the node's)"
	if pf.GetDetail() != "" {
		words = pf.GetDetail() + "; " + words
	}
	pf.Detail = words
	return true
}
