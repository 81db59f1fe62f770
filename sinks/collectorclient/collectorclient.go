// Package collectorclient dials the collector's gRPC API the way every
// reader of the Follow stream does (eventpipe follow and diagnose, the
// gateway driver proxy): TLS unless told otherwise, an optional client
// certificate, and a bearer token re-read from its file on every call so a
// rotated token is used after the next reconnect. Several collector
// replicas (Kafka mode) are one target: a broken connection moves the next
// call to the next replica that answers, and the reader resumes there from
// its cursor or position.
package collectorclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	"github.com/eventpipe/eventpipe/api/config"
)

// Options says how to reach the collector.
type Options struct {
	// Address is host:port, or several replicas' addresses separated by
	// commas (tried in that order).
	Address    string
	CAFile     string // PEM roots for the collector's certificate; empty: the system's
	CertFile   string // client certificate (mTLS), with KeyFile
	KeyFile    string
	ServerName string // the name the certificate must carry, when not the address's host
	TokenFile  string // bearer token, re-read on every call; empty: none
	Insecure   bool   // plaintext (loopback development only)
	// MaxRecvBytes bounds one received message (the collector's send limit).
	MaxRecvBytes int
	// Names label the options in errors with what the user wrote: flags
	// ("--ca") or YAML paths ("collector.ca_file").
	Names Names
}

// Names are the user-facing names of the options, for error messages.
type Names struct {
	Address, CA, CertKey, Token string
}

// Dial builds the client connection; like grpc.NewClient it does not
// connect yet. Keepalive finds a silently dead connection (a vanished node,
// a dropped port-forward) while the stream is quiet; 30s stays above the
// collector's ping enforcement (10s).
func Dial(o Options) (*grpc.ClientConn, error) {
	var opts []grpc.DialOption
	if o.Insecure {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", o.Names.CA, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s %s: no PEM certificate", o.Names.CA, o.CAFile)
			}
			tc.RootCAs = pool
		}
		if o.CertFile != "" {
			kp, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", o.Names.CertKey, err)
			}
			tc.Certificates = []tls.Certificate{kp}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	if o.TokenFile != "" {
		if _, err := ReadToken(o.Names.Token, o.TokenFile); err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tokenCreds{name: o.Names.Token, path: o.TokenFile, secure: !o.Insecure}))
	}
	if o.MaxRecvBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxRecvBytes)))
	}
	opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithUserAgent(buildinfo.UserAgent("collector-client")))
	target := o.Address
	if addrs := Addresses(o.Address); len(addrs) > 1 {
		var r *manual.Resolver
		target, r = ReplicasResolver(addrs)
		opts = append(opts, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(PickFirst(false)))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", o.Names.Address, o.Address, err)
	}
	return conn, nil
}

// Addresses splits a comma-separated list of collector addresses.
func Addresses(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// ReplicasResolver serves several collector replicas to gRPC as one target
// (use it with PickFirst). Each address keeps its host as the TLS server
// name, as if dialled alone.
func ReplicasResolver(addrs []string) (string, *manual.Resolver) {
	r := manual.NewBuilderWithScheme("eventpipe-collectors")
	state := resolver.State{}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: host})
	}
	r.InitialState(state)
	return r.Scheme() + ":///collectors", r
}

// PickFirst is the service config that keeps one connection, to the first
// replica that answers (of the list in its order, or shuffled: many agents
// then spread over the replicas); when it breaks, the next call goes to
// whichever replica answers then.
func PickFirst(shuffle bool) string {
	return fmt.Sprintf(`{"loadBalancingConfig":[{"pick_first":{"shuffleAddressList":%v}}]}`, shuffle)
}

// ReadToken reads a bearer token file; name labels it in errors. An empty
// file is an error: it would send an empty token and be refused anyway.
func ReadToken(name, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s %s is empty", name, path)
	}
	if config.IsPlaceholderToken(tok) {
		return "", fmt.Errorf("%s %s holds the example's placeholder token: write the token the collector's tokens file gives this client", name, path)
	}
	return tok, nil
}

// tokenCreds sends "authorization: Bearer <token>", re-reading the file on
// every call.
type tokenCreds struct {
	name, path string
	secure     bool
}

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := ReadToken(t.name, t.path)
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (t tokenCreds) RequireTransportSecurity() bool { return t.secure }
