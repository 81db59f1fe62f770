package agent

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify"
)

// VerifiedEventIDPrefix starts the event_id of the update a registry
// answer makes to a pull failure's diagnosis: "registry-verified/" and the
// event_id of the occurrence it updates (stored once however often sent).
const VerifiedEventIDPrefix = "registry-verified/"

// verifiable lists the pull-failure categories a registry's answer can
// decide. The others are the node's (disk, runtime store, never pull, the
// kubelet's own limit) or the network between node and registry, which
// the agent's own view of the registry does not share.
var verifiable = []string{
	eventpipev1.CategoryNotFound, eventpipev1.CategoryUnauthorized, eventpipev1.CategoryNotFoundOrUnauthorized,
	eventpipev1.CategoryRateLimited, eventpipev1.CategoryPlatformMismatch, eventpipev1.CategoryUnknown, eventpipev1.CategoryUnrecognised,
}

// pullVerifier checks pull failures' images off the event path
// (verify.pull_failures). The processor calls annotate for every
// occurrence (a map lookup: the cached answer upgrades it in place, or it
// is queued); run checks the queue one image at a time and hands the
// processor an update for each conclusive answer.
type pullVerifier struct {
	v        *verify.Verifier
	platform string
	log      *slog.Logger
	m        *metrics
	jobs     chan *eventpipev1.Occurrence
	out      chan<- *eventpipev1.Occurrence
	queued   map[string]bool // images queued or being checked (processor goroutine only)
	done     chan string     // images checked, back to the processor
}

func newPullVerifier(v *verify.Verifier, cfg VerifyConfig, log *slog.Logger, m *metrics, out chan<- *eventpipev1.Occurrence) *pullVerifier {
	return &pullVerifier{v: v, platform: cfg.Platform, log: log, m: m, out: out,
		jobs: make(chan *eventpipev1.Occurrence, cfg.Queue), queued: map[string]bool{}, done: make(chan string, cfg.Queue+1)} // one per image queued or in flight: never full
}

// annotate runs on the processor goroutine and never blocks: a fresh cached
// answer upgrades o's diagnosis in place; otherwise the last conclusive
// answer does (marked as being asked again) and o's image is queued for a
// check once (overflow counted).
func (pv *pullVerifier) annotate(o *eventpipev1.Occurrence) {
	pf := o.GetPullFailure()
	if pf == nil || pf.GetImage() == "" || pf.GetDecidedBy() == eventpipev1.DecidedByRegistry || !slices.Contains(verifiable, pf.GetCategory()) {
		return
	}
	for drained := false; !drained; {
		select {
		case img := <-pv.done:
			delete(pv.queued, img)
		default:
			drained = true
		}
	}
	r, fresh := pv.v.Cached(pf.GetImage(), pv.platform)
	if fresh && r.Apply(pf) {
		pv.m.verifyApplied.WithLabelValues("cached").Inc()
		return
	}
	// No fresh conclusive answer: the last one stands until a new one
	// replaces it, rather than the text cause for the moment in between.
	if last, ok := pv.v.LastVerified(pf.GetImage(), pv.platform); ok && last.Apply(pf) {
		pf.Detail += "; the registry's answer of " + last.CheckedAt.UTC().Format(time.RFC3339) + ", being asked again"
		pv.m.verifyApplied.WithLabelValues("kept").Inc()
	}
	if fresh {
		return
	}
	if pv.queued[pf.GetImage()] {
		return
	}
	select {
	case pv.jobs <- proto.Clone(o).(*eventpipev1.Occurrence):
		pv.queued[pf.GetImage()] = true
	default:
		pv.m.verifyDropped.Inc()
	}
}

// run checks queued images until ctx ends.
func (pv *pullVerifier) run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case o := <-pv.jobs:
			pf := o.GetPullFailure()
			r := pv.v.Check(ctx, pf.GetImage(), pv.platform)
			select {
			case pv.done <- pf.GetImage():
			default: // the processor drains done before it queues
			}
			if !r.Apply(pf) {
				pv.log.Debug("registry check left the diagnosis as it was", "image", pf.GetImage(), "answer", r.Answer, "detail", r.Detail)
				continue
			}
			pv.m.verifyApplied.WithLabelValues("update").Inc()
			o.EventId = VerifiedEventIDPrefix + o.GetEventId()
			select {
			case pv.out <- o:
			case <-ctx.Done():
				return nil
			}
		}
	}
}
