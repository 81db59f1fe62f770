package agent

import (
	"slices"
	"strconv"
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
//
// Rule "pull secrets sent or not": the pod's spec.imagePullSecrets names
// are the credentials the kubelet sends besides the node's own (the
// service account's are copied there by ServiceAccount admission when the
// pod names none, so the pod's list is what the kubelet uses; the agent
// watches no ServiceAccount and reads no Secret). A failure in words that
// cannot tell a missing repository from missing credentials
// (not_found_or_unauthorized), of a pod with no pending
// FailedToRetrieveImagePullSecret, is then: with no pull secret at all,
// unauthorized (the pull went out anonymous, as a private repository's
// refusal reads); with pull secrets sent, not_found (the registry took the
// login, since a refused one reads "incorrect username or password", and
// still will not name the repository). Both likely: a public image under a
// wrong name reads the same anonymously, and an account without access to
// an existing repository the same with a login. Never applied to unknown or
// unrecognised: the words then do not say it was a refusal at all.
//
// Rule "one node or many": for a failure on the way to the registry
// (registry_unreachable, tls_error, timeout) the node that reported it
// (the kubelet Event's source host) is recorded per image. When another
// node pulled the same image within pulledTTL, the cause is local to the
// failing node (its DNS, proxy, firewall, CA store); when the image failed
// in the same category on two or more nodes within pullContextTTL and no
// node pulled it, the cause is on the registry's side or on a path every
// node shares. Category unchanged (the words decide it), decided_by
// cluster_context, confidence likely; the detail names the nodes. A
// single-node cluster never has the evidence: its failures are left as they
// were.

const (
	reasonMissingPullSecret = "FailedToRetrieveImagePullSecret"
	pullContextTTL          = 10 * time.Minute
	pullContextMax          = 4096
	pulledTTL               = 30 * time.Minute
	// nodesPerImage bounds the failing nodes remembered per image: two
	// decide the rule, the rest only lengthen the detail.
	nodesPerImage = 16
)

type pulledBy struct {
	pod, node string
	at        time.Time
}

// failedOn is where an image failed on the way to the registry: the
// category of the last failure and, per node, when.
type failedOn struct {
	category string
	nodes    map[string]time.Time
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
	// pulledOn: image (normalised) -> node -> when a pod there last pulled it.
	pulledOn map[string]map[string]time.Time
	failed   map[string]*failedOn // image (normalised) -> nodes it failed on
	forder   []string
	// pullSecrets returns the spec.imagePullSecrets names of a cached pod
	// (ok false: not cached; nil func: rule "pull secrets sent or not" off).
	pullSecrets func(namespace, name string) (names []string, ok bool)
}

func newPullContext(pullSecrets func(namespace, name string) ([]string, bool)) *pullContext {
	return &pullContext{pods: map[string]missingSecrets{}, pulled: map[string]pulledBy{},
		pulledOn: map[string]map[string]time.Time{}, failed: map[string]*failedOn{}, pullSecrets: pullSecrets}
}

// networkCategories are the failures on the way from a node to the
// registry, which rule "one node or many" places.
var networkCategories = []string{eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryTLSError, eventpipev1.CategoryTimeout}

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
		node := o.GetReportingInstance()
		c.pulled[k] = pulledBy{pod: key, node: node, at: now}
		if node != "" {
			if c.pulledOn[k] == nil {
				c.pulledOn[k] = map[string]time.Time{}
			}
			putNode(c.pulledOn[k], node, now)
		}
		for len(c.porder) > pullContextMax {
			delete(c.pulled, c.porder[0])
			delete(c.pulledOn, c.porder[0])
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
	if c.nodes(o.GetReportingInstance(), pf, now) {
		return true
	}
	switch pf.GetCategory() {
	case eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.CategoryUnknown, eventpipev1.CategoryUnrecognised:
	default:
		return false
	}
	m, ok := c.pods[key]
	if !ok || now.Sub(m.at) > pullContextTTL {
		return c.secretsSent(obj.GetNamespace(), obj.GetName(), pf)
	}
	pf.Category = eventpipev1.CategoryUnauthorized
	words := "the kubelet could not retrieve the pod's image pull secret(s) " + m.names + " (" + reasonMissingPullSecret + ") and pulled without them"
	decidedByContext(pf, words)
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
	words := "pod " + by.pod + on + " pulled the same image at " + by.at.UTC().Format(time.RFC3339) +
		", so it exists: this pod's pull lacks credentials that work (its imagePullSecrets, its service account's, or the node's)"
	decidedByContext(pf, words)
	return true
}

// secretsSent applies rule "pull secrets sent or not" to pf, a failure of
// pod namespace/name with no pending FailedToRetrieveImagePullSecret.
func (c *pullContext) secretsSent(namespace, name string, pf *eventpipev1.PullFailure) bool {
	if c.pullSecrets == nil || pf.GetCategory() != eventpipev1.CategoryNotFoundOrUnauthorized {
		return false
	}
	names, ok := c.pullSecrets(namespace, name)
	if !ok {
		return false
	}
	var words string
	if len(names) == 0 {
		pf.Category = eventpipev1.CategoryUnauthorized
		words = "the pod names no imagePullSecrets (nor its service account, whose are copied into the pod when it names none), " +
			"so the kubelet pulled without credentials but the node's own: a private repository refuses so; if the image is public, its name is wrong"
	} else {
		pf.Category = eventpipev1.CategoryNotFound
		words = "the kubelet sent the pod's image pull secret(s) " + strings.Join(names, ", ") +
			" and the registry took the login (a refused one reads \"incorrect username or password\"), yet it will not name the repository: " +
			"it does not exist under this name, or that account has no access to it"
	}
	decidedByContext(pf, words)
	return true
}

// nodes records a failure on the way to the registry on node and applies
// rule "one node or many" to it.
func (c *pullContext) nodes(node string, pf *eventpipev1.PullFailure, now time.Time) bool {
	if node == "" || pf.GetImage() == "" || !slices.Contains(networkCategories, pf.GetCategory()) {
		return false
	}
	k := imageKey(pf.GetImage())
	f := c.failed[k]
	if f == nil {
		f = &failedOn{nodes: map[string]time.Time{}}
		c.failed[k] = f
		c.forder = append(c.forder, k)
		for len(c.forder) > pullContextMax {
			delete(c.failed, c.forder[0])
			c.forder = c.forder[1:]
		}
	}
	if f.category != pf.GetCategory() {
		f.category = pf.GetCategory()
		clear(f.nodes) // another cause: the earlier nodes say nothing about this one
	}
	putNode(f.nodes, node, now)

	var words string
	if on, at, ok := c.pulledOnOtherNode(k, node, now); ok {
		words = "node " + on + " pulled the same image at " + at.UTC().Format(time.RFC3339) +
			", so the registry serves it: the cause is local to node " + node + " (its DNS, proxy, firewall or CA store)"
	} else {
		var failing []string
		for n, at := range f.nodes {
			if now.Sub(at) <= pullContextTTL {
				failing = append(failing, n)
			}
		}
		if len(failing) < 2 {
			return false
		}
		slices.Sort(failing)
		words = "the same image fails the same way on " + strconv.Itoa(len(failing)) + " nodes (" + strings.Join(failing, ", ") +
			") and no node pulled it: the cause is the registry's or on a path every node shares, not one node's"
	}
	decidedByContext(pf, words)
	return true
}

// pulledOnOtherNode returns a node other than node where image k was
// pulled within pulledTTL (the latest).
func (c *pullContext) pulledOnOtherNode(k, node string, now time.Time) (string, time.Time, bool) {
	var on string
	var last time.Time
	for n, at := range c.pulledOn[k] {
		if n != node && now.Sub(at) <= pulledTTL && at.After(last) {
			on, last = n, at
		}
	}
	return on, last, on != ""
}

// putNode records node at now in m, forgetting the oldest node when m
// holds nodesPerImage others.
func putNode(m map[string]time.Time, node string, now time.Time) {
	if _, ok := m[node]; !ok && len(m) >= nodesPerImage {
		oldest := ""
		for n, at := range m {
			if oldest == "" || at.Before(m[oldest]) {
				oldest = n
			}
		}
		delete(m, oldest)
	}
	m[node] = now
}

// decidedByContext marks pf decided by cluster context, likely (every
// context rule leaves another cause possible), and appends the rule's
// words to the runtime's.
func decidedByContext(pf *eventpipev1.PullFailure, words string) {
	pf.DecidedBy, pf.Confidence = eventpipev1.DecidedByClusterContext, eventpipev1.ConfidenceLikely
	if pf.GetDetail() != "" {
		words = pf.GetDetail() + "; " + words
	}
	pf.Detail = words
}
