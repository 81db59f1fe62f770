package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify"
)

// supervisorChecker verifies the OpenShell gateway's supervisor image
// (verify.supervisor) before a sandbox needs it: it reads the gateway's
// Deployment or StatefulSet every interval (one GET, and one of its
// ConfigMap when the image is set in the gateway's TOML file), and asks the
// registry at start, whenever the resolved image changes, and again once
// the last answer is older than verify.registry.cache_ttl. When the
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
}

func (s *supervisorChecker) run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if !s.once(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// once reads, resolves and (when due) verifies; false when ctx ended.
func (s *supervisorChecker) once(ctx context.Context) bool {
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
	for _, k := range kinds {
		plural := "statefulsets"
		if k == "Deployment" {
			plural = "deployments"
		}
		raw, err = s.kc.getJSON(ctx, "/apis/apps/v1/namespaces/"+url.PathEscape(s.cfg.Namespace)+"/"+plural+"/"+url.PathEscape(s.cfg.Name))
		if err == nil || !isNotFound(err) {
			break
		}
	}
	if err != nil {
		return supervisorImage{}, fmt.Errorf("read gateway workload %s/%s: %w", s.cfg.Namespace, s.cfg.Name, err)
	}
	return resolveSupervisor(raw, s.cfg.Container, func(name string) (map[string]string, error) {
		b, err := s.kc.getJSON(ctx, "/api/v1/namespaces/"+url.PathEscape(s.cfg.Namespace)+"/configmaps/"+url.PathEscape(name))
		if err != nil {
			return nil, err
		}
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal(b, &cm); err != nil {
			return nil, fmt.Errorf("decode ConfigMap %s: %w", name, err)
		}
		return cm.Data, nil
	})
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
