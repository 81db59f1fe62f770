package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify"
)

// supervisorChecker verifies the OpenShell gateway's supervisor image
// (verify.supervisor) before a sandbox needs it: it reads the gateway's
// Deployment or StatefulSet (one GET, and one of its ConfigMap when the
// image is set in the gateway's TOML file), then watches exactly those
// objects (a watch each, fieldSelector metadata.name, from the
// resourceVersion read) and reads again when one changes. It asks the
// registry at start, whenever the resolved image changes, and again once
// the last answer is older than verify.registry.cache_ttl. After an error,
// an inconclusive answer or a refused watch it reads again every
// verify.supervisor.interval instead. When the
// answer changes it hands the processor a supervisor-check occurrence
// (eventpipev1.IsSupervisorCheck), and it keeps
// eventpipe_agent_supervisor_image_bad at 1 while the registry says the
// image cannot be pulled.
type supervisorChecker struct {
	cfg       SupervisorCheckConfig
	platform  string
	ttl       time.Duration
	cluster   string
	kc        *kubeClient
	v         *verify.Verifier
	log       *slog.Logger
	m         *metrics
	out       chan<- *eventpipev1.Occurrence
	now       func() time.Time
	lastImage string
	lastAns   string
	lastAt    time.Time
	lastErr   string
	// targets are the objects the last resolve read, watched until one
	// changes; retry is set when the last round needs another soon (an
	// error or an inconclusive answer).
	targets  []watchTarget
	retry    bool
	watchErr string
}

// watchTarget is one object the supervisor image was read from.
type watchTarget struct {
	res  apiResource
	name string
	rv   string
}

func (s *supervisorChecker) run(ctx context.Context) error {
	for {
		if !s.once(ctx) || !s.wait(ctx) {
			return nil
		}
	}
}

// wait blocks until the next round is due: a change of a watched object,
// the last answer's TTL, or verify.supervisor.interval when the round
// needs a retry or nothing can be watched. false when ctx ended.
func (s *supervisorChecker) wait(ctx context.Context) bool {
	d := s.cfg.Interval
	if !s.retry && !s.lastAt.IsZero() && len(s.targets) > 0 {
		d = max(s.lastAt.Add(s.ttl).Sub(s.now()), 0)
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if s.retry || len(s.targets) == 0 {
		<-wctx.Done()
		return ctx.Err() == nil
	}
	start := time.Now()
	refused := make(chan error, len(s.targets))
	var wg sync.WaitGroup
	for _, tg := range s.targets {
		wg.Go(func() {
			if err := s.watchOne(wctx, tg); err != nil {
				refused <- err
			}
			cancel() // a change, the server ended the watch, or it was refused: read again
		})
	}
	wg.Wait()
	close(refused)
	if err := <-refused; err != nil && ctx.Err() == nil {
		if msg := err.Error(); msg != s.watchErr {
			s.watchErr = msg
			s.log.Warn("supervisor image check: cannot watch the gateway's objects; reading them every verify.supervisor.interval instead", "err", err)
		}
		s.retry = true
	}
	// At most one round a second, whatever the watches do (a rollout
	// changes the workload several times in a row).
	if rest := time.Second - time.Since(start); rest > 0 && ctx.Err() == nil {
		t := time.NewTimer(rest)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return ctx.Err() == nil
}

// watchOne returns nil when tg changed or the server ended the watch (or
// ctx ended), the error when the watch was refused.
func (s *supervisorChecker) watchOne(ctx context.Context, tg watchTarget) error {
	st, err := s.kc.watch(ctx, tg.res, listOptions{resourceVersion: tg.rv, fieldSelector: "metadata.name=" + tg.name})
	if err != nil {
		if ctx.Err() != nil || isExpired(err) { // Gone: a new read has a newer resourceVersion
			return nil
		}
		return fmt.Errorf("watch %s %s: %w", tg.res, tg.name, err)
	}
	defer st.close()
	for {
		typ, _, err := st.next()
		if err != nil || typ != watchBookmark {
			return nil
		}
	}
}

// once reads, resolves and (when due) verifies; false when ctx ended.
func (s *supervisorChecker) once(ctx context.Context) bool {
	s.retry = true // until this round ends with an answer
	img, err := s.resolve(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		s.m.supervisorErrors.Inc()
		if msg := err.Error(); msg != s.lastErr { // once per distinct problem, not every interval
			s.lastErr = msg
			s.log.Warn("supervisor image check: cannot tell the gateway's supervisor image", "err", err)
		}
		return true
	}
	s.lastErr = ""
	now := s.now()
	if img.Image == s.lastImage && now.Sub(s.lastAt) < s.ttl {
		s.retry = false
		return true
	}
	r := s.v.Check(ctx, img.Image, s.platform)
	if ctx.Err() != nil {
		return false
	}
	switch r.Answer {
	case verify.AnswerThrottled, verify.AnswerTimeout, verify.AnswerUnreachable:
		// Inconclusive: say so, keep the last answer, ask again next interval.
		s.log.Warn("supervisor image check: the registry gave no answer", "image", img.Image, "answer", r.Answer, "detail", r.Detail)
		return true
	}
	s.retry = false
	bad := r.Conclusive()
	if bad {
		s.m.supervisorBad.Set(1)
	} else {
		s.m.supervisorBad.Set(0)
	}
	changed := img.Image != s.lastImage || r.Answer != s.lastAns
	s.lastImage, s.lastAns, s.lastAt = img.Image, r.Answer, now
	if !changed {
		return true
	}
	if bad {
		s.log.Error("supervisor image cannot be pulled: every new sandbox will fail", "image", img.Image, "source", img.Source,
			"workload", img.Kind+"/"+img.Namespace+"/"+img.Name, "answer", r.Answer, "detail", r.Detail)
	} else {
		s.log.Info("supervisor image verified", "image", img.Image, "source", img.Source, "answer", r.Answer)
	}
	select {
	case s.out <- s.occurrence(img, r):
	case <-ctx.Done():
		return false
	}
	return true
}

// resolve reads the gateway workload (and its ConfigMap when needed).
func (s *supervisorChecker) resolve(ctx context.Context) (supervisorImage, error) {
	kinds := []string{"StatefulSet", "Deployment"}
	if s.cfg.Kind != "" {
		kinds = []string{s.cfg.Kind}
	}
	var raw []byte
	var err error
	var res apiResource
	for _, k := range kinds {
		res = apiResource{group: "apps", version: "v1", resource: "statefulsets", namespace: s.cfg.Namespace, json: true}
		if k == "Deployment" {
			res.resource = "deployments"
		}
		raw, err = s.kc.getJSON(ctx, res.path()+"/"+url.PathEscape(s.cfg.Name))
		if err == nil || !isNotFound(err) {
			break
		}
	}
	s.targets = s.targets[:0]
	if err != nil {
		return supervisorImage{}, fmt.Errorf("read gateway workload %s/%s: %w", s.cfg.Namespace, s.cfg.Name, err)
	}
	targets := []watchTarget{{res: res, name: s.cfg.Name, rv: resourceVersionOf(raw)}}
	img, err := resolveSupervisor(raw, s.cfg.Container, func(name string) (map[string]string, error) {
		cmRes := apiResource{version: "v1", resource: "configmaps", namespace: s.cfg.Namespace, json: true}
		b, err := s.kc.getJSON(ctx, cmRes.path()+"/"+url.PathEscape(name))
		if err != nil {
			return nil, err
		}
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal(b, &cm); err != nil {
			return nil, fmt.Errorf("decode ConfigMap %s: %w", name, err)
		}
		targets = append(targets, watchTarget{res: cmRes, name: name, rv: resourceVersionOf(b)})
		return cm.Data, nil
	})
	if err == nil {
		s.targets = targets
	}
	return img, err
}

// resourceVersionOf reads metadata.resourceVersion of an object's JSON
// ("" when absent: the watch then starts from the API server's newest).
func resourceVersionOf(raw []byte) string {
	var o struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Metadata.ResourceVersion
}

// occurrence is the supervisor-check occurrence for one answer.
func (s *supervisorChecker) occurrence(img supervisorImage, r verify.Result) *eventpipev1.Occurrence {
	gw := s.cfg.GatewayID
	if gw == "" {
		gw = img.GatewayID
	}
	if gw == "" {
		gw = "openshell"
	}
	at := timestamppb.New(r.CheckedAt)
	o := &eventpipev1.Occurrence{
		SchemaVersion:      eventpipev1.SchemaVersion,
		EventId:            fmt.Sprintf("%s%s/%s/%d", eventpipev1.SupervisorCheckEventIDPrefix, img.Namespace, img.Name, r.CheckedAt.UnixNano()),
		OccurredAt:         at,
		ObservedAt:         at,
		Cluster:            s.cluster,
		Namespace:          img.Namespace,
		InvolvedObject:     &eventpipev1.ObjectRef{Kind: img.Kind, ApiVersion: "apps/v1", Namespace: img.Namespace, Name: img.Name, Uid: img.UID},
		Type:               "Normal",
		Reason:             eventpipev1.ReasonSupervisorImageVerified,
		Message:            fmt.Sprintf("supervisor image %s (from %s): %s", img.Image, img.Source, r.Detail),
		Count:              1,
		ReportingComponent: eventpipev1.ComponentAgent,
		Sandbox:            &eventpipev1.Sandbox{GatewayId: gw},
		Attribution:        eventpipev1.AttributionNone,
		Role:               eventpipev1.RoleSupervisor,
		Image:              img.Image,
		ImageRole:          eventpipev1.ImageRoleSupervisor,
	}
	if r.Conclusive() {
		o.Type, o.Reason = "Warning", eventpipev1.ReasonSupervisorImageUnavailable
		// The image as configured: the way the runtime will name it.
		o.PullFailure = &eventpipev1.PullFailure{Image: img.Image, Attempts: 1, FirstSeen: at, LastSeen: at}
		r.Apply(o.PullFailure)
	}
	return o
}
