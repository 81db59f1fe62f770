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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	yaml "go.yaml.in/yaml/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Roles a caller can hold.
const (
	RoleAgent  = "agent"
	RoleReader = "reader"
)

// AllWorkspaces in a reader's workspaces grants every workspace.
const AllWorkspaces = "*"

// Reasons of eventpipe_collector_auth_failures_total (a fixed list).
const (
	authMissing         = "missing_credentials"
	authBadToken        = "bad_token"
	authUnknownIdentity = "unknown_identity"
	authWrongRole       = "wrong_role"
	authWorkspace       = "workspace_not_granted"
)

var authReasons = []string{authMissing, authBadToken, authUnknownIdentity, authWrongRole, authWorkspace}

// Principal is an authenticated caller.
type Principal struct {
	Name string
	Role string
	// Workspaces a reader may follow; AllWorkspaces grants every one.
	Workspaces []string
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

func (p *Principal) allWorkspaces() bool {
	return p.Insecure || slices.Contains(p.Workspaces, AllWorkspaces)
}

// TokenEntry is one line of the tokens file.
type TokenEntry struct {
	Token      string   `yaml:"token"`
	Name       string   `yaml:"name"`
	Role       string   `yaml:"role"`
	Workspaces []string `yaml:"workspaces,omitempty"`
}

// Identity maps a client certificate (its subject CN, or one of its DNS /
// URI SANs) to a role.
type Identity struct {
	Name       string   `yaml:"name"`
	Role       string   `yaml:"role"`
	Workspaces []string `yaml:"workspaces,omitempty"`
}

// LoadTokens reads a tokens file: YAML (a list of {token, name, role,
// workspaces}) or, when its name ends in .csv, CSV lines
// "token,name,role[,workspace;workspace...]". Every problem is reported.
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
				return nil, fmt.Errorf("parse tokens file %s: line %d: want token,name,role[,workspaces] (got %d fields)", path, line, len(rec))
			}
			e := TokenEntry{Token: strings.TrimSpace(rec[0]), Name: strings.TrimSpace(rec[1]), Role: strings.TrimSpace(rec[2])}
			if len(rec) == 4 {
				for _, w := range strings.Split(rec[3], ";") {
					if w = strings.TrimSpace(w); w != "" {
						e.Workspaces = append(e.Workspaces, w)
					}
				}
			}
			entries = append(entries, e)
		}
	} else if err := yaml.UnmarshalStrict(data, &entries); err != nil {
		return nil, fmt.Errorf("parse tokens file %s: %w", path, err)
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
		errs = append(errs, validateRole(at, e.Role, e.Workspaces)...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return entries, nil
}

func validateRole(at, role string, workspaces []string) []error {
	var errs []error
	switch role {
	case RoleAgent:
		if len(workspaces) > 0 {
			errs = append(errs, fmt.Errorf("%s.workspaces: only a reader has workspaces", at))
		}
	case RoleReader:
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
		t.ps = append(t.ps, &Principal{Name: e.Name, Role: e.Role, Workspaces: e.Workspaces})
	}
	return t
}

func (t *tokenTable) lookup(token string) *Principal {
	// Hashing first gives equal-length inputs to ConstantTimeCompare.
	h := sha256.Sum256([]byte(token))
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

// authenticator authenticates every gRPC call and checks its role. Its state
// is swapped atomically on reload, so open streams keep running.
type authenticator struct {
	state    atomic.Pointer[authState]
	failures func(reason string)
}

func newAuthState(cfg AuthConfig, tokens []TokenEntry) *authState {
	s := &authState{tokens: newTokenTable(tokens), identities: map[string]*Principal{}, insecure: cfg.Insecure}
	for _, id := range cfg.Identities {
		s.identities[id.Name] = &Principal{Name: id.Name, Role: id.Role, Workspaces: id.Workspaces}
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

// authenticate finds the caller: a bearer token first, then a verified
// client certificate, then (insecure dev mode only) the anonymous caller.
func (a *authenticator) authenticate(ctx context.Context) (*Principal, error) {
	st := a.state.Load()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get("authorization"); len(vals) > 0 {
			v := vals[0]
			const prefix = "bearer "
			if len(v) <= len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
				return nil, a.fail(authBadToken, codes.Unauthenticated, "authorization metadata must be \"Bearer <token>\"")
			}
			if p := st.tokens.lookup(strings.TrimSpace(v[len(prefix):])); p != nil {
				return p, nil
			}
			return nil, a.fail(authBadToken, codes.Unauthenticated, "unknown bearer token")
		}
	}
	if pr, ok := peer.FromContext(ctx); ok {
		if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			cert := ti.State.VerifiedChains[0][0]
			for _, n := range certNames(cert) {
				if p := st.identities[n]; p != nil {
					return p, nil
				}
			}
			return nil, a.fail(authUnknownIdentity, codes.PermissionDenied,
				fmt.Sprintf("client certificate %q is not mapped to a role (auth.identities)", cert.Subject.CommonName))
		}
	}
	if st.insecure {
		return &Principal{Name: "insecure-anonymous", Insecure: true}, nil
	}
	return nil, a.fail(authMissing, codes.Unauthenticated, "no credentials: send a bearer token or a client certificate")
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
	p, err := a.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	want := methodRole(fullMethod)
	if want == "" {
		return nil, a.fail(authWrongRole, codes.PermissionDenied, "unknown method")
	}
	if !p.Insecure && p.Role != want {
		return nil, a.fail(authWrongRole, codes.PermissionDenied,
			fmt.Sprintf("%s %q may not call %s (needs role %s)", p.Role, p.Name, fullMethod, want))
	}
	return context.WithValue(ctx, principalKey{}, p), nil
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
	return handler(ctx, req)
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authedStream) Context() context.Context { return s.ctx }

func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := a.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &authedStream{ServerStream: ss, ctx: ctx})
}
