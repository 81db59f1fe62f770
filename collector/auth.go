package collector

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	yaml "go.yaml.in/yaml/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/eventpipe/eventpipe/api/config"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Roles a caller can hold.
const (
	RoleAgent  = "agent"
	RoleReader = "reader"
)

// AllWorkspaces in a reader's workspaces grants every workspace.
const AllWorkspaces = "*"

// AllClusters in an agent's clusters lets it write every cluster (one
// agent credential shared by several clusters; logged at start).
const AllClusters = "*"

// Reasons of eventpipe_collector_auth_failures_total (a fixed list).
const (
	authMissing         = "missing_credentials"
	authBadToken        = "bad_token"
	authUnknownIdentity = "unknown_identity"
	authWrongRole       = "wrong_role"
	authWorkspace       = "workspace_not_granted"
	authCluster         = "cluster_not_granted"
)

var authReasons = []string{authMissing, authBadToken, authUnknownIdentity, authWrongRole, authWorkspace, authCluster}

// Principal is an authenticated caller.
type Principal struct {
	Name string
	Role string
	// Workspaces a reader may follow; AllWorkspaces grants every one.
	Workspaces []string
	// Clusters an agent may write (occurrences, its resume cursor) and
	// read the cursor of; AllClusters grants every one.
	Clusters []string
	// Insecure marks the anonymous caller of insecure dev mode: any role,
	// every workspace.
	Insecure bool
}

// mayRead reports whether p may see occurrences of workspace ws.
func (p *Principal) mayRead(ws string) bool {
	if p.Insecure {
		return true
	}
	if ws == "" {
		return false
	}
	return slices.Contains(p.Workspaces, AllWorkspaces) || slices.Contains(p.Workspaces, ws)
}

// mayReadSome reports whether p may read at least one workspace.
func (p *Principal) mayReadSome() bool {
	return p.Insecure || len(p.Workspaces) > 0
}

// mayWrite reports whether p may ingest for cluster, and read or move its
// cursor.
func (p *Principal) mayWrite(cluster string) bool {
	if p.Insecure {
		return true
	}
	return slices.Contains(p.Clusters, AllClusters) || slices.Contains(p.Clusters, cluster)
}

func (p *Principal) allWorkspaces() bool {
	return p.Insecure || slices.Contains(p.Workspaces, AllWorkspaces)
}

// TokenEntry is one line of the tokens file. An agent lists the clusters
// it may write, a reader the workspaces it may follow.
type TokenEntry struct {
	Token      string   `yaml:"token"`
	Name       string   `yaml:"name"`
	Role       string   `yaml:"role"`
	Workspaces []string `yaml:"workspaces,omitempty"`
	Clusters   []string `yaml:"clusters,omitempty"`
}

// Identity maps a client certificate (its subject CN, or one of its DNS /
// URI SANs) to a role: an agent with its clusters, a reader with its
// workspaces.
type Identity struct {
	Name       string   `yaml:"name"`
	Role       string   `yaml:"role"`
	Workspaces []string `yaml:"workspaces,omitempty"`
	Clusters   []string `yaml:"clusters,omitempty"`
}

// LoadTokens reads a tokens file: YAML (a list of {token, name, role,
// clusters | workspaces}) or, when its name ends in .csv, CSV lines
// "token,name,role,scope;scope..." where the scopes are an agent's
// clusters or a reader's workspaces. Every problem is reported; a file
// without any token is refused too (it would lock every caller out).
func LoadTokens(path string) ([]TokenEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokens file: %w", err)
	}
	var entries []TokenEntry
	if strings.EqualFold(filepath.Ext(path), ".csv") {
		r := csv.NewReader(strings.NewReader(string(data)))
		r.FieldsPerRecord = -1
		r.Comment = '#'
		r.TrimLeadingSpace = true
		for {
			rec, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("parse tokens file %s: %w", path, err)
			}
			if len(rec) < 3 || len(rec) > 4 {
				line, _ := r.FieldPos(0)
				return nil, fmt.Errorf("parse tokens file %s: line %d: want token,name,role,clusters-or-workspaces (got %d fields)", path, line, len(rec))
			}
			e := TokenEntry{Token: strings.TrimSpace(rec[0]), Name: strings.TrimSpace(rec[1]), Role: strings.TrimSpace(rec[2])}
			if len(rec) == 4 {
				var scopes []string
				for _, w := range strings.Split(rec[3], ";") {
					if w = strings.TrimSpace(w); w != "" {
						scopes = append(scopes, w)
					}
				}
				if e.Role == RoleAgent {
					e.Clusters = scopes
				} else {
					e.Workspaces = scopes
				}
			}
			entries = append(entries, e)
		}
	} else if err := yaml.UnmarshalStrict(data, &entries); err != nil {
		return nil, fmt.Errorf("parse tokens file %s: %w", path, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("tokens file %s holds no token: every caller would be refused; add one, or remove auth.tokens_file", path)
	}
	var errs []error
	names := map[string]bool{}
	tokens := map[string]bool{}
	for i, e := range entries {
		at := fmt.Sprintf("%s[%d]", path, i)
		if e.Token == "" {
			errs = append(errs, fmt.Errorf("%s.token: must not be empty", at))
		} else if len(e.Token) < 16 {
			errs = append(errs, fmt.Errorf("%s.token: must be at least 16 characters", at))
		} else if config.IsPlaceholderToken(e.Token) {
			errs = append(errs, fmt.Errorf("%s.token: %q is the example's placeholder: generate a random token (openssl rand -hex 32)", at, e.Token))
		}
		if tokens[e.Token] && e.Token != "" {
			errs = append(errs, fmt.Errorf("%s.token: duplicate token", at))
		}
		tokens[e.Token] = true
		if e.Name == "" {
			errs = append(errs, fmt.Errorf("%s.name: must not be empty", at))
		} else if names[e.Name] {
			errs = append(errs, fmt.Errorf("%s.name: duplicate name %q", at, e.Name))
		}
		names[e.Name] = true
		errs = append(errs, validateRole(at, e.Role, e.Workspaces, e.Clusters)...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return entries, nil
}

func validateRole(at, role string, workspaces, clusters []string) []error {
	var errs []error
	switch role {
	case RoleAgent:
		if len(workspaces) > 0 {
			errs = append(errs, fmt.Errorf("%s.workspaces: only a reader has workspaces", at))
		}
		if len(clusters) == 0 {
			errs = append(errs, fmt.Errorf("%s.clusters: an agent needs the clusters it may write (its agent's cluster name; %q = any cluster)", at, AllClusters))
		}
		seen := map[string]bool{}
		for j, c := range clusters {
			switch {
			case strings.TrimSpace(c) == "":
				errs = append(errs, fmt.Errorf("%s.clusters[%d]: must not be empty", at, j))
			case strings.TrimSpace(c) != c:
				errs = append(errs, fmt.Errorf("%s.clusters[%d]: %q has leading or trailing spaces", at, j, c))
			case strings.EqualFold(c, config.PlaceholderCluster):
				errs = append(errs, fmt.Errorf("%s.clusters[%d]: %q is the placeholder of the shipped manifests: write the cluster's real name (the agent's cluster)", at, j, c))
			case seen[c]:
				errs = append(errs, fmt.Errorf("%s.clusters[%d]: duplicate %q", at, j, c))
			}
			seen[c] = true
		}
	case RoleReader:
		if len(clusters) > 0 {
			errs = append(errs, fmt.Errorf("%s.clusters: only an agent has clusters (a reader is scoped by workspaces)", at))
		}
		if len(workspaces) == 0 {
			errs = append(errs, fmt.Errorf("%s.workspaces: a reader needs at least one workspace (or %q)", at, AllWorkspaces))
		}
		for j, w := range workspaces {
			if strings.TrimSpace(w) == "" {
				errs = append(errs, fmt.Errorf("%s.workspaces[%d]: must not be empty", at, j))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("%s.role: must be %q or %q, got %q", at, RoleAgent, RoleReader, role))
	}
	return errs
}

// tokenTable is an immutable snapshot of the tokens; lookups compare every
// token in constant time so timing does not reveal how much of a guess
// matched, nor which entry.
type tokenTable struct {
	hashes [][32]byte
	ps     []*Principal
}

func newTokenTable(entries []TokenEntry) *tokenTable {
	t := &tokenTable{}
	for _, e := range entries {
		t.hashes = append(t.hashes, sha256.Sum256([]byte(e.Token)))
		t.ps = append(t.ps, &Principal{Name: e.Name, Role: e.Role, Workspaces: e.Workspaces, Clusters: e.Clusters})
	}
	return t
}

func (t *tokenTable) lookup(token string) *Principal {
	return t.lookupHash(sha256.Sum256([]byte(token)))
}

// lookupHash finds a token by its SHA-256. Comparing hashes gives
// equal-length inputs to ConstantTimeCompare.
func (t *tokenTable) lookupHash(h [sha256.Size]byte) *Principal {
	var found *Principal
	for i := range t.hashes {
		if subtle.ConstantTimeCompare(h[:], t.hashes[i][:]) == 1 {
			found = t.ps[i]
		}
	}
	return found
}

// authState is what hot reload swaps as a whole.
type authState struct {
	tokens     *tokenTable
	identities map[string]*Principal
	insecure   bool
}

// authenticator authenticates every gRPC call and checks its role, and
// for an agent the cluster of every request (GetCursor, each Batch of a
// Ship stream and its occurrences). Its state is swapped atomically on
// reload; an open stream keeps the principal it started with unless the
// reload removed or changed its credential, which ends it (replace).
type authenticator struct {
	state    atomic.Pointer[authState]
	failures func(reason string)
	// revoked counts streams ended by a reload (replace).
	revoked func()
	logger  *slog.Logger

	mu   sync.Mutex
	open map[*openStream]struct{}
}

func newAuthState(cfg AuthConfig, tokens []TokenEntry) *authState {
	s := &authState{tokens: newTokenTable(tokens), identities: map[string]*Principal{}, insecure: cfg.Insecure}
	for _, id := range cfg.Identities {
		s.identities[id.Name] = &Principal{Name: id.Name, Role: id.Role, Workspaces: id.Workspaces, Clusters: id.Clusters}
	}
	return s
}

// methodRole is the role each RPC requires.
func methodRole(fullMethod string) string {
	switch {
	case strings.HasPrefix(fullMethod, "/"+eventpipev1.Ingest_ServiceDesc.ServiceName+"/"):
		return RoleAgent
	case strings.HasPrefix(fullMethod, "/"+eventpipev1.Follow_ServiceDesc.ServiceName+"/"):
		return RoleReader
	}
	return ""
}

func (a *authenticator) fail(reason string, code codes.Code, msg string) error {
	if a.failures != nil {
		a.failures(reason)
	}
	return status.Error(code, msg)
}

// credential is what authenticated a call: a token's hash, a certificate
// name mapped by auth.identities, or insecure mode. A reload looks it up
// again in the new state to find what became of open streams.
type credential struct {
	kind  string // credToken, credCert, credInsecure
	token [sha256.Size]byte
	name  string
}

const (
	credToken    = "token"
	credCert     = "cert"
	credInsecure = "insecure"
)

// resolve is the principal cred stands for in st, nil if none.
func (st *authState) resolve(cred credential) *Principal {
	switch cred.kind {
	case credToken:
		return st.tokens.lookupHash(cred.token)
	case credCert:
		return st.identities[cred.name]
	case credInsecure:
		if st.insecure {
			return &Principal{Name: "insecure-anonymous", Insecure: true}
		}
	}
	return nil
}

// authenticate finds the caller: a bearer token first, then a verified
// client certificate, then (insecure dev mode only) the anonymous caller.
func (a *authenticator) authenticate(ctx context.Context) (*Principal, error) {
	p, _, err := a.authenticateCred(ctx)
	return p, err
}

func (a *authenticator) authenticateCred(ctx context.Context) (*Principal, credential, error) {
	st := a.state.Load()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get("authorization"); len(vals) > 0 {
			v := vals[0]
			const prefix = "bearer "
			if len(v) <= len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
				return nil, credential{}, a.fail(authBadToken, codes.Unauthenticated, "authorization metadata must be \"Bearer <token>\"")
			}
			cred := credential{kind: credToken, token: sha256.Sum256([]byte(strings.TrimSpace(v[len(prefix):])))}
			if p := st.tokens.lookupHash(cred.token); p != nil {
				return p, cred, nil
			}
			return nil, credential{}, a.fail(authBadToken, codes.Unauthenticated, "unknown bearer token")
		}
	}
	if pr, ok := peer.FromContext(ctx); ok {
		if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			cert := ti.State.VerifiedChains[0][0]
			for _, n := range certNames(cert) {
				if p := st.identities[n]; p != nil {
					return p, credential{kind: credCert, name: n}, nil
				}
			}
			return nil, credential{}, a.fail(authUnknownIdentity, codes.PermissionDenied,
				fmt.Sprintf("client certificate %q is not mapped to a role (auth.identities)", cert.Subject.CommonName))
		}
	}
	if st.insecure {
		return &Principal{Name: "insecure-anonymous", Insecure: true}, credential{kind: credInsecure}, nil
	}
	return nil, credential{}, a.fail(authMissing, codes.Unauthenticated, "no credentials: send a bearer token or a client certificate")
}

func certNames(c *x509.Certificate) []string {
	var names []string
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	names = append(names, c.DNSNames...)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	names = append(names, c.EmailAddresses...)
	return names
}

func (a *authenticator) authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	ctx, _, err := a.authorizeCred(ctx, fullMethod)
	return ctx, err
}

func (a *authenticator) authorizeCred(ctx context.Context, fullMethod string) (context.Context, credential, error) {
	p, cred, err := a.authenticateCred(ctx)
	if err != nil {
		return nil, credential{}, err
	}
	want := methodRole(fullMethod)
	if want == "" {
		return nil, credential{}, a.fail(authWrongRole, codes.PermissionDenied, "unknown method")
	}
	if !p.Insecure && p.Role != want {
		return nil, credential{}, a.fail(authWrongRole, codes.PermissionDenied,
			fmt.Sprintf("%s %q may not call %s (needs role %s)", p.Role, p.Name, fullMethod, want))
	}
	return context.WithValue(ctx, principalKey{}, p), cred, nil
}

type principalKey struct{}

func principalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := a.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if err := a.checkClusters(principalFrom(ctx), info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// clusterScoped is a request naming the cluster it reads or writes
// (GetCursorRequest, Batch).
type clusterScoped interface{ GetCluster() string }

// checkClusters refuses a request of an agent for a cluster it was not
// granted: the request's cluster, and for a Batch every occurrence that
// names its own. Refusals are counted (cluster_not_granted) and logged.
func (a *authenticator) checkClusters(p *Principal, method string, req any) error {
	if p == nil || p.Insecure || p.Role != RoleAgent {
		return nil
	}
	cs, ok := req.(clusterScoped)
	if !ok {
		return nil
	}
	refuse := func(cluster string) error {
		if a.logger != nil {
			a.logger.Warn("refused: agent wrote a cluster it was not granted", "caller", p.Name, "cluster", cluster, "granted", p.Clusters, "method", method)
		}
		return a.fail(authCluster, codes.PermissionDenied,
			fmt.Sprintf("agent %q may not write cluster %q (granted: %s)", p.Name, cluster, strings.Join(p.Clusters, ", ")))
	}
	// An empty cluster is left to the handler (InvalidArgument).
	if c := cs.GetCluster(); c != "" && !p.mayWrite(c) {
		return refuse(c)
	}
	if b, ok := req.(*eventpipev1.Batch); ok {
		for _, o := range b.GetOccurrences() {
			if c := o.GetCluster(); c != "" && c != b.GetCluster() && !p.mayWrite(c) {
				return refuse(c)
			}
		}
	}
	return nil
}

// warnWildcards logs the agents that may write every cluster.
func (a *authenticator) warnWildcards(cfg AuthConfig, tokens []TokenEntry) {
	if a.logger == nil {
		return
	}
	var names []string
	for _, e := range tokens {
		if slices.Contains(e.Clusters, AllClusters) {
			names = append(names, e.Name)
		}
	}
	for _, id := range cfg.Identities {
		if slices.Contains(id.Clusters, AllClusters) {
			names = append(names, id.Name)
		}
	}
	if len(names) > 0 {
		a.logger.Warn("agents granted every cluster (clusters: [\"*\"]): each may write any cluster's occurrences and move its cursor", "agents", names)
	}
}

type authedStream struct {
	grpc.ServerStream
	ctx    context.Context
	auth   *authenticator
	method string
}

func (s *authedStream) Context() context.Context { return s.ctx }

// RecvMsg checks every message an agent sends (each Batch) against its
// clusters; a refused one ends the stream with PermissionDenied, after the
// acks of the batches before it.
func (s *authedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.auth == nil {
		return nil
	}
	return s.auth.checkClusters(principalFrom(s.ctx), s.method, m)
}

func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cred, err := a.authorizeCred(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	o := &openStream{cred: cred, p: principalFrom(ctx), method: info.FullMethod, cancel: cancel}
	a.track(o)
	defer a.untrack(o)
	err = handler(srv, &authedStream{ServerStream: ss, ctx: ctx, auth: a, method: info.FullMethod})
	if o.ended.Load() {
		// The handler saw its context end; the caller learns why.
		return context.Cause(ctx)
	}
	return err
}

// openStream is a stream the authenticator let through, kept so that a
// reload can end it when its credential no longer grants what it did.
type openStream struct {
	cred   credential
	p      *Principal
	method string
	cancel context.CancelCauseFunc
	ended  atomic.Bool // by replace; the cause is the status to return
}

func (a *authenticator) track(o *openStream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.open == nil {
		a.open = map[*openStream]struct{}{}
	}
	a.open[o] = struct{}{}
}

func (a *authenticator) untrack(o *openStream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.open, o)
}

// replace swaps the auth state (a reload) and ends every open stream whose
// credential was removed (Unauthenticated) or now maps to a different
// principal: another role, name, workspaces or clusters (Unavailable, so
// the caller reconnects and gets what the new grants allow). Streams whose
// grants did not change keep running. It returns how many were ended.
func (a *authenticator) replace(st *authState) int {
	a.state.Store(st)
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for o := range a.open {
		np := st.resolve(o.cred)
		if samePrincipal(np, o.p) {
			continue
		}
		code, why := codes.Unavailable, "its grants changed"
		if np == nil {
			code, why = codes.Unauthenticated, "its credential was removed"
		}
		if a.logger != nil {
			a.logger.Warn("ending an open stream: a reload changed its credential", "caller", o.p.Name, "method", o.method, "why", why)
		}
		o.ended.Store(true)
		o.cancel(status.Error(code, fmt.Sprintf("stream ended by the collector: %s in a config reload; reconnect", why)))
		if a.revoked != nil {
			a.revoked()
		}
		delete(a.open, o)
		n++
	}
	return n
}

func samePrincipal(a, b *Principal) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Name == b.Name && a.Role == b.Role && a.Insecure == b.Insecure &&
		slices.Equal(a.Workspaces, b.Workspaces) && slices.Equal(a.Clusters, b.Clusters)
}
