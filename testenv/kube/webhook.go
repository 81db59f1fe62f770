package kube

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DenyWebhookConfig is a validating admission webhook that denies the
// creation of the pods its selector matches, as a cluster's policy
// webhook (Kyverno, Gatekeeper, an in-house one) denies what breaks a
// rule.
type DenyWebhookConfig struct {
	// Name is the webhook's name (a DNS name with at least three
	// segments, as the API server requires: "x.example.test"), which the
	// API server puts in its denial; also the name of the
	// ValidatingWebhookConfiguration.
	Name string
	// Message is the webhook's reason for the denial.
	Message string
	// ObjectSelector picks the pods it denies (required: a webhook that
	// denies every pod would stop the cluster's own).
	ObjectSelector *metav1.LabelSelector
}

// DenyWebhook is a DenyWebhookConfig served over HTTPS on 127.0.0.1 by
// this process, with a certificate of its own that the
// ValidatingWebhookConfiguration's caBundle alone trusts. The API server
// calls it by URL for every pod CREATE its selector matches.
type DenyWebhook struct {
	cfg    DenyWebhookConfig
	caPEM  []byte
	url    string
	srv    *http.Server
	done   chan error
	denied atomic.Int64
	once   sync.Once
}

// StartDenyWebhook starts the server; Close stops it.
func StartDenyWebhook(cfg DenyWebhookConfig) (*DenyWebhook, error) {
	if cfg.Name == "" || cfg.Message == "" || cfg.ObjectSelector == nil {
		return nil, errors.New("deny webhook: name, message and object selector are required")
	}
	certPEM, keyPEM, err := servingCert(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("deny webhook %s: %w", cfg.Name, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("deny webhook %s: %w", cfg.Name, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("deny webhook %s: %w", cfg.Name, err)
	}
	w := &DenyWebhook{cfg: cfg, caPEM: certPEM, url: "https://" + ln.Addr().String() + "/validate", done: make(chan error, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /validate", w.review)
	w.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { w.done <- w.srv.Serve(tls.NewListener(ln, w.srv.TLSConfig)) }()
	return w, nil
}

// URL is where the API server calls it.
func (w *DenyWebhook) URL() string { return w.url }

// Denied is how many pods it has denied.
func (w *DenyWebhook) Denied() int64 { return w.denied.Load() }

// review answers one AdmissionReview: a denial with the configured
// message (HTTP 200 with allowed false, as the API expects; the API server
// words it "admission webhook <name> denied the request: <message>").
func (w *DenyWebhook) review(rw http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		http.Error(rw, "read review: "+err.Error(), http.StatusBadRequest)
		return
	}
	var in admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &in); err != nil || in.Request == nil {
		http.Error(rw, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	out := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Response: &admissionv1.AdmissionResponse{UID: in.Request.UID, Allowed: true},
	}
	if in.Request.Operation == admissionv1.Create && in.Request.Kind.Kind == "Pod" {
		out.Response.Allowed = false
		out.Response.Result = &metav1.Status{Code: http.StatusForbidden, Message: w.cfg.Message}
		w.denied.Add(1)
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(&out)
}

// Register creates (or replaces) the ValidatingWebhookConfiguration that
// makes the API server call it: pod CREATE, the configured selector,
// failurePolicy Fail, no side effects.
func (w *DenyWebhook) Register(ctx context.Context, cs kubernetes.Interface) error {
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: w.cfg.Name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    w.cfg.Name,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &w.url, CABundle: w.caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			ObjectSelector:          w.cfg.ObjectSelector,
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	api := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if err := api.Delete(ctx, vwc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deny webhook %s: replace its configuration: %w", w.cfg.Name, err)
	}
	if _, err := api.Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deny webhook %s: %w", w.cfg.Name, err)
	}
	return nil
}

// Unregister deletes its ValidatingWebhookConfiguration: with the server
// gone, failurePolicy Fail would refuse every pod the selector matches.
func (w *DenyWebhook) Unregister(ctx context.Context, cs kubernetes.Interface) error {
	err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, w.cfg.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deny webhook %s: delete its configuration: %w", w.cfg.Name, err)
	}
	return nil
}

// Close stops the server and waits for it.
func (w *DenyWebhook) Close() error {
	var err error
	w.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = w.srv.Shutdown(ctx)
		if serr := <-w.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
	})
	return err
}
