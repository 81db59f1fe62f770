package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// SecretRef names one Secret.
type SecretRef struct {
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

// pullSecretRefresh is how long the credentials read from the granted pull
// secrets are used before they are read again (a rotated password is
// picked up within it).
const pullSecretRefresh = time.Minute

// pullSecretTimeout bounds the reads of the granted pull secrets.
const pullSecretTimeout = 10 * time.Second

// secretKeychain is the registry checks' keychain when the operator grants
// the agent get on named pull secrets (verify.pull_secrets; the chart's
// Role names exactly those Secrets). It reads each Secret's docker config
// (kubernetes.io/dockerconfigjson or the older dockercfg) with one GET,
// again once pullSecretRefresh has passed, and answers each registry with
// the credentials of the first listed Secret that has an entry for it;
// any other registry is asked anonymously. A Secret that cannot be read
// (forbidden, gone, not a docker config) is logged and counted
// (eventpipe_agent_verify_pull_secret_errors_total), and its last good
// credentials are kept. Resolve runs in the registry-check goroutines,
// never on the event path.
type secretKeychain struct {
	kc   *kubeClient
	refs []SecretRef
	log  *slog.Logger
	m    *metrics
	now  func() time.Time

	mu     sync.Mutex
	loaded time.Time
	bySec  map[SecretRef]map[string]authn.AuthConfig // secret -> registry host -> credentials
}

func newSecretKeychain(kc *kubeClient, refs []SecretRef, log *slog.Logger, m *metrics) *secretKeychain {
	return &secretKeychain{kc: kc, refs: refs, log: log, m: m, now: time.Now, bySec: map[SecretRef]map[string]authn.AuthConfig{}}
}

// Resolve implements authn.Keychain.
func (k *secretKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loaded.IsZero() || k.now().Sub(k.loaded) >= pullSecretRefresh {
		k.load()
	}
	host := registryHost(r.RegistryStr())
	for _, ref := range k.refs {
		if c, ok := k.bySec[ref][host]; ok {
			return authn.FromConfig(c), nil
		}
	}
	return authn.Anonymous, nil
}

// load reads every granted Secret (k.mu held).
func (k *secretKeychain) load() {
	ctx, cancel := context.WithTimeout(context.Background(), pullSecretTimeout)
	defer cancel()
	for _, ref := range k.refs {
		creds, err := k.read(ctx, ref)
		if err != nil {
			k.m.verifyPullSecretErrors.Inc()
			k.log.Warn("cannot read a pull secret for registry checks; its last credentials (if any) stay in use", "namespace", ref.Namespace, "name", ref.Name, "err", err)
			continue
		}
		k.bySec[ref] = creds
	}
	k.loaded = k.now()
}

func (k *secretKeychain) read(ctx context.Context, ref SecretRef) (map[string]authn.AuthConfig, error) {
	b, err := k.kc.getJSON(ctx, "/api/v1/namespaces/"+url.PathEscape(ref.Namespace)+"/secrets/"+url.PathEscape(ref.Name))
	if err != nil {
		return nil, fmt.Errorf("get secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return parseDockerSecret(b)
}

// parseDockerSecret reads the registry credentials of a Secret (JSON as
// the API serves it) by registry host.
func parseDockerSecret(b []byte) (map[string]authn.AuthConfig, error) {
	var s struct {
		Type string            `json:"type"`
		Data map[string][]byte `json:"data"` // base64 in JSON
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decode secret: %w", err)
	}
	var auths map[string]authn.AuthConfig
	switch {
	case s.Data[".dockerconfigjson"] != nil:
		var cfg struct {
			Auths map[string]authn.AuthConfig `json:"auths"`
		}
		if err := json.Unmarshal(s.Data[".dockerconfigjson"], &cfg); err != nil {
			return nil, fmt.Errorf("decode .dockerconfigjson: %w", err)
		}
		auths = cfg.Auths
	case s.Data[".dockercfg"] != nil:
		if err := json.Unmarshal(s.Data[".dockercfg"], &auths); err != nil {
			return nil, fmt.Errorf("decode .dockercfg: %w", err)
		}
	default:
		return nil, fmt.Errorf("secret of type %q has no .dockerconfigjson or .dockercfg", s.Type)
	}
	out := make(map[string]authn.AuthConfig, len(auths))
	for key, c := range auths {
		out[registryHost(key)] = c
	}
	return out, nil
}

// registryHost turns a docker config key ("https://index.docker.io/v1/",
// "ghcr.io", "registry.example:5000/path") or a reference's registry into
// the host go-containerregistry names it by.
func registryHost(key string) string {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	if i := strings.IndexByte(key, '/'); i >= 0 {
		key = key[:i]
	}
	switch key {
	case "docker.io", "registry-1.docker.io", "index.docker.io":
		return name.DefaultRegistry
	}
	return key
}
