//go:build !agentonly

package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/eventpipe/eventpipe/api/cliconfig"
	"github.com/eventpipe/eventpipe/api/cliflag"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/sinks/collectorclient"
)

func init() {
	register("follow", command{
		summary: "show a sandbox's Kubernetes events from the collector (tail, then live)",
		run:     runFollow,
	})
}

const followUsage = `Usage:
  eventpipe follow (--sandbox ID | --workspace WS [--name NAME] | --gateway ID) [flags]

Shows what Kubernetes said about a sandbox (scheduling, image pulls, back-offs)
without kubectl: the last --tail events from the collector, then new ones as
they arrive, one line each in the 'openshell logs' style:

  [<secs>.<ms>] [<source>] [<level>] [<role>/<container> or <kind>/<name>] <message> k=v ...

source is kubelet, sched (the scheduler) or k8s (any other component); level
is WARN for Warning events and image-pull failures, else INFO. An image that cannot be pulled leads
with which image and why (the kubelet's full message is in -o json):

  [1793268638.250] [kubelet] [WARN ] [workload/workspace-init] workload image docker.io/library/busybox:0.0.0-does-not-exist: not_found (docker.io/library/busybox:0.0.0-does-not-exist: not found) reason=Failed image=docker.io/library/busybox:0.0.0-does-not-exist pull=not_found disposition=retrying cursor=3

A sandbox deleted and created again under its name has a new id: the old
one's lines (its deletion, reason SandboxDeleted, and late events of its
old pods) carry deleted_sandbox=<old id>, so they never pass for the new
sandbox's.

disposition=persistent means retrying will not fix it (fix the image or the
pull secret); eventpipe never stops or deletes a sandbox.

Examples:
  # why is sandbox img-missing of workspace repro stuck?
  eventpipe follow --collector collector.eventpipe:7070 --ca ca.pem --token-file reader.token \
      --workspace repro --name img-missing
  # the last 200 events of one sandbox, then exit
  eventpipe follow --sandbox 2ff21e26-1a7b-49a2-a640-14ae153f93ea --tail 200 --no-follow
  # resume where a previous run stopped (it prints the cursor on exit)
  eventpipe follow --sandbox 2ff21e26-1a7b-49a2-a640-14ae153f93ea --after 1234
  # the same against collectors in Kafka mode (any replica; it prints the position on exit)
  eventpipe follow --workspace repro --after-position <the position it printed>
  # machine-readable: one JSON object per line {"cursor": "...", "occurrence": {...}}
  eventpipe follow --gateway openshell -o json --insecure
  # only new events, against a local development collector (plaintext)
  eventpipe follow --insecure --sandbox 2ff21e26-1a7b-49a2-a640-14ae153f93ea --tail 0

A reader token sees only the workspaces it was granted: a sandbox of another
workspace shows no events. Ctrl-C stops (exit 0) and prints the cursor (or, from
collectors in Kafka mode, the position) to resume from. While following, an unreachable collector is retried with backoff;
with several replicas in --collector (a,b,c) a broken stream resumes on the first of them that answers.

Exit status: 0 done or interrupted, 1 failed, 2 bad flags (or a --tail or
--after the collector refuses), 4 the collector
cannot be reached (--no-follow; following, it is retried), 5 the collector
refused the credentials or the token's grants, 6 another error of the
collector (the table: docs/cli.md).

Flags:
`

// followOptions are the parsed flags of eventpipe follow.
type followOptions struct {
	addr                         string
	tokenFile                    string
	caFile, certFile, keyFile    string
	serverName                   string
	insecure                     bool
	context                      string // the context of the context file to use
	sandbox, workspace, name, gw string
	tail                         uint
	after                        uint64
	afterPosition                string // base64url, as printed on exit
	noFollow                     bool
	output                       string
}

// Reconnect backoff while following; variables so tests can shorten them.
var (
	followBackoffMin = 500 * time.Millisecond
	followBackoffMax = 30 * time.Second
)

func runFollow(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	var o followOptions
	fs := flag.NewFlagSet("eventpipe follow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.connFlags(fs)
	fs.StringVar(&o.sandbox, "sandbox", "", "selector: the sandbox id (UUID)")
	fs.StringVar(&o.workspace, "workspace", "", "selector: every sandbox of this workspace (or one, with --name)")
	fs.StringVar(&o.name, "name", "", "with --workspace: the sandbox name")
	fs.StringVar(&o.gw, "gateway", "", "selector: every sandbox of this gateway id")
	fs.UintVar(&o.tail, "tail", 50, "replay the last N matching events first (ignored with --after)")
	fs.Uint64Var(&o.after, "after", 0, "resume: every matching event after this cursor (printed when a previous run stopped)")
	fs.StringVar(&o.afterPosition, "after-position", "", "resume from collectors in Kafka mode: every matching event after this position (printed when a previous run stopped)")
	fs.BoolVar(&o.noFollow, "no-follow", false, "print the replay and exit instead of following live")
	fs.StringVar(&o.output, "output", "text", "output format: text or json (table is another name of text)")
	fs.StringVar(&o.output, "o", "text", "shorthand for --output")
	fs.Usage = func() {
		fmt.Fprint(stderr, followUsage)
		fs.PrintDefaults()
	}
	if exit, ok := parseFlags(fs, "follow", args, stderr); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "eventpipe follow: unexpected arguments %q (the selector is a flag: --sandbox ID)\n", fs.Args())
		return 2
	}
	if err := o.resolveConn(fs); err != nil {
		fmt.Fprintf(stderr, "eventpipe follow: %v\n", err)
		return exitUsage
	}
	if problems := o.validate(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "eventpipe follow: %s\n", p)
		}
		fmt.Fprintln(stderr, "run 'eventpipe follow --help' for usage")
		return 2
	}
	conn, err := o.dial()
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe follow: %v\n", err)
		return 2
	}
	defer conn.Close()
	f := &follower{opts: o, client: eventpipev1.NewFollowClient(conn), stdout: stdout, stderr: stderr}
	return f.run(ctx)
}

// validate reports every flag problem.
func (o *followOptions) validate() []string {
	var p []string
	n := 0
	for _, s := range []string{o.sandbox, o.workspace, o.gw} {
		if s != "" {
			n++
		}
	}
	switch {
	case n == 0:
		p = append(p, "no selector: pass exactly one of --sandbox ID, --workspace WS [--name NAME], --gateway ID")
	case n > 1:
		p = append(p, "more than one selector: pass exactly one of --sandbox ID, --workspace WS [--name NAME], --gateway ID")
	}
	if o.name != "" && o.workspace == "" {
		p = append(p, "--name needs --workspace (sandbox names are unique only within a workspace)")
	}
	o.output = cliflag.Output(o.output)
	if o.output != "text" && o.output != "json" {
		p = append(p, fmt.Sprintf("--output must be text or json, got %q", o.output))
	}
	if _, err := decodePosition(o.afterPosition); err != nil {
		p = append(p, fmt.Sprintf("--after-position is not a position printed by eventpipe follow: %v", err))
	}
	if o.tail > 1<<32-1 {
		p = append(p, fmt.Sprintf("--tail %d is too large", o.tail))
	}
	return append(p, o.connProblems()...)
}

// connFlags registers the flags that say how to reach the collector (shared
// by follow and diagnose).
func (o *followOptions) connFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.addr, "collector", collector.DefaultGRPCListen, "collector gRPC address host:port, or several replicas' addresses separated by commas (Kafka mode): a broken stream resumes on the next that answers")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding a bearer token with role reader (re-read on every reconnect)")
	fs.StringVar(&o.caFile, "ca", "", "CA bundle to verify the collector's certificate (default: system roots)")
	fs.StringVar(&o.certFile, "cert", "", "client certificate for mTLS (with --key)")
	fs.StringVar(&o.keyFile, "key", "", "client key for mTLS (with --cert)")
	fs.StringVar(&o.serverName, "server-name", "", "TLS server name of the collector (default: the host of --collector)")
	fs.BoolVar(&o.insecure, "insecure", false, "plaintext gRPC, no TLS (a local or port-forwarded collector)")
	fs.StringVar(&o.context, "context", "", "use this context of the context file (eventpipe config get-contexts) instead of its current one")
}

// getenv reads the environment (tests replace it).
var getenv = os.Getenv

// resolveConn fills the connection settings the command line left out from
// the EVENTPIPE_* environment, then the context file, then the defaults
// (precedence and grouping: api/cliconfig). Call it after parsing.
func (o *followOptions) resolveConn(fs *flag.FlagSet) error {
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "collector", "ca", "token-file", "server-name", "insecure":
			given[f.Name] = f.Value.String()
		}
	})
	src := cliconfig.Source{Flags: given, Getenv: getenv, Context: o.context, DefaultCollector: collector.DefaultGRPCListen}
	if path, err := cliconfig.Path(getenv); err == nil {
		if src.File, err = cliconfig.Load(path); err != nil {
			return err
		}
	}
	s, err := cliconfig.Resolve(src)
	if err != nil {
		return err
	}
	o.addr, o.caFile, o.tokenFile, o.serverName, o.insecure = s.Collector, s.CA, s.TokenFile, s.ServerName, s.Insecure
	return nil
}

// connProblems reports every problem of the connection flags.
func (o *followOptions) connProblems() []string {
	var p []string
	if o.addr == "" {
		p = append(p, "--collector must be set (host:port)")
	}
	if (o.certFile == "") != (o.keyFile == "") {
		p = append(p, "--cert and --key go together")
	}
	if o.insecure && (o.caFile != "" || o.certFile != "" || o.serverName != "") {
		p = append(p, "--insecure (plaintext) cannot be combined with --ca, --cert or --server-name")
	}
	return p
}

// dial builds the client connection the same way the agent dials the
// collector: TLS unless --insecure, optional mTLS, bearer token re-read from
// its file on every call. grpc.NewClient does not connect yet.
func (o *followOptions) dial() (*grpc.ClientConn, error) {
	return collectorclient.Dial(collectorclient.Options{
		Address: o.addr, CAFile: o.caFile, CertFile: o.certFile, KeyFile: o.keyFile,
		ServerName: o.serverName, TokenFile: o.tokenFile, Insecure: o.insecure,
		MaxRecvBytes: collector.DefaultMaxSendBytes,
		Names:        collectorclient.Names{Address: "--collector", CA: "--ca", CertKey: "--cert/--key", Token: "--token-file"},
	})
}

// follower runs one eventpipe follow: subscribe, print, and on a broken
// stream resume from the last cursor.
type follower struct {
	opts   followOptions
	client eventpipev1.FollowClient
	stdout io.Writer
	stderr io.Writer

	// resume is the cursor to resume after: the last message printed, or
	// the log's end when the subscription started and nothing matched yet.
	resume uint64
	// position is resume's counterpart from collectors in Kafka mode
	// (FollowResponse.position, or the eventpipe-last-position-bin
	// header); nil from a collector in local mode. Both are sent on a
	// resume: each mode reads its own.
	position []byte
	// lossReported is the loss a DataLoss error already reported, so the
	// header of the resubscription does not report it twice.
	lossReported uint64
}

func (f *follower) request() *eventpipev1.FollowRequest {
	req := &eventpipev1.FollowRequest{
		SandboxId: f.opts.sandbox, Workspace: f.opts.workspace, SandboxName: f.opts.name, GatewayId: f.opts.gw,
		NoFollow: f.opts.noFollow,
	}
	switch {
	case f.resume > 0 || len(f.position) > 0:
		req.AfterCursor, req.AfterPosition = f.resume, f.position
	case f.opts.after > 0 || f.opts.afterPosition != "":
		req.AfterCursor = f.opts.after
		req.AfterPosition, _ = decodePosition(f.opts.afterPosition)
	default:
		req.Tail = uint32(f.opts.tail)
	}
	return req
}

// run subscribes until the replay ends (--no-follow), the context ends
// (Ctrl-C), or the collector refuses; it returns the exit status.
func (f *follower) run(ctx context.Context) int {
	backoff := followBackoffMin
	for {
		gotHeader, err := f.once(ctx)
		if err == nil || ctx.Err() != nil {
			f.printResume()
			return 0
		}
		st := status.Convert(err)
		switch st.Code() {
		case codes.DataLoss:
			// The subscriber fell behind retention mid-stream: say so and
			// resume at once; the resubscription reads on from the oldest
			// record still stored.
			n, after := parseDataLoss(st.Message())
			if after > f.resume {
				f.resume = after
			}
			f.warnLost(n, f.resume, false)
			f.lossReported = n
			continue
		case codes.Unavailable:
			if gotHeader {
				backoff = followBackoffMin
			}
			at, is := "the collector at "+f.opts.addr, "is"
			if len(collectorclient.Addresses(f.opts.addr)) > 1 {
				at, is = "the collectors at "+f.opts.addr, "are"
			}
			msg := fmt.Sprintf("%s %s not reachable: %s", at, is, st.Message())
			msg += tlsHint(st.Message())
			if gotHeader {
				msg = fmt.Sprintf("lost the stream from %s: %s", at, st.Message())
			}
			if f.opts.noFollow {
				fmt.Fprintf(f.stderr, "eventpipe follow: %s\n", msg)
				f.printResume()
				return exitUnreachable
			}
			wait := jitter(backoff)
			// The next subscription goes to the first replica that answers
			// (the one that broke, or the next of --collector's list).
			then := "retrying"
			switch {
			case len(f.position) > 0: // Kafka mode: a position, not a cursor
				then = "will resume from the last position"
			case f.resume > 0:
				then = fmt.Sprintf("will resume after cursor %d", f.resume)
			}
			fmt.Fprintf(f.stderr, "eventpipe follow: %s; %s in %s\n", msg, then, wait.Round(time.Millisecond))
			select {
			case <-ctx.Done():
				f.printResume()
				return 0
			case <-time.After(wait):
			}
			backoff = min(2*backoff, followBackoffMax)
			continue
		}
		fmt.Fprintf(f.stderr, "eventpipe follow: %s\n", f.explain(st))
		f.printResume()
		return collectorExit(st.Code())
	}
}

// explain turns a refusal into what the user should do.
func (f *follower) explain(st *status.Status) string {
	switch st.Code() {
	case codes.Unauthenticated:
		if f.opts.tokenFile == "" {
			return fmt.Sprintf("the collector refused the credentials: pass --token-file with a reader token (or --cert/--key) (%s)", st.Message())
		}
		return fmt.Sprintf("the collector refused the credentials: pass --token-file with a valid reader token; the one in %s was not accepted (%s)", f.opts.tokenFile, st.Message())
	case codes.PermissionDenied:
		what, need := "this selection", "the sandboxes' workspaces"
		switch {
		case f.opts.workspace != "":
			what = fmt.Sprintf("workspace %q", f.opts.workspace)
			need = what
		case f.opts.sandbox != "":
			what, need = fmt.Sprintf("sandbox %s", f.opts.sandbox), "the sandbox's workspace"
		case f.opts.gw != "":
			what = fmt.Sprintf("gateway %q", f.opts.gw)
		}
		return fmt.Sprintf("the collector does not allow these credentials to follow %s: use a token or client certificate with role reader granted %s (%s)", what, need, st.Message())
	case codes.OutOfRange:
		if len(f.request().GetAfterPosition()) > 0 {
			return fmt.Sprintf("cannot resume from that position: %s; run again without --after-position (or with --tail)", st.Message())
		}
		return fmt.Sprintf("cannot resume after cursor %d: %s; run again without --after (or with --tail)", f.request().GetAfterCursor(), st.Message())
	case codes.InvalidArgument:
		return fmt.Sprintf("the collector refused the request: %s", st.Message())
	case codes.DeadlineExceeded, codes.Canceled:
		return fmt.Sprintf("stream ended: %s", st.Message())
	}
	return fmt.Sprintf("follow from the collector at %s: %s: %s", f.opts.addr, st.Code(), st.Message())
}

// once runs one subscription. gotHeader reports whether the collector
// accepted it (so a later Unavailable is a lost stream, not a refused dial).
func (f *follower) once(ctx context.Context) (gotHeader bool, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := f.request()
	stream, err := f.client.Follow(ctx, req)
	if err != nil {
		return false, err
	}
	// A refusal arrives without the collector's header (trailers only, or a
	// transport error): Recv then returns its status.
	hdr, err := stream.Header()
	if err == nil && len(hdr.Get(collector.HeaderLastCursor)) > 0 {
		gotHeader = true
		f.checkHeader(req, hdr)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			// The replay is complete: every record up to the log's end at
			// subscription time was considered. (The trailer only repeats
			// a loss the header already reported.)
			f.resume = max(f.resume, mdUint(hdr, collector.HeaderLastCursor))
			if p := mdBytes(hdr, collector.HeaderLastPosition); len(p) > 0 {
				f.position = p
			}
			return gotHeader, nil
		}
		if err != nil {
			return gotHeader, err
		}
		if err := f.print(m); err != nil {
			return gotHeader, status.Errorf(codes.Canceled, "write output: %v", err)
		}
		f.resume = m.GetCursor()
		if len(m.GetPosition()) > 0 {
			f.position = m.GetPosition()
		}
	}
}

func (f *follower) checkHeader(req *eventpipev1.FollowRequest, hdr metadata.MD) {
	if lost := mdUint(hdr, collector.HeaderLostRecords); lost > 0 {
		// Right after a DataLoss the header counts that loss again, plus
		// whatever retention removed meanwhile: report only the rest.
		if lost > f.lossReported {
			f.warnLost(lost-f.lossReported, req.GetAfterCursor(), f.lossReported > 0)
		}
	}
	f.lossReported = 0
	if from := mdUint(hdr, collector.HeaderTailScannedFrom); from > 0 {
		fmt.Fprintf(f.stderr, "eventpipe follow: note: the collector stopped looking for older events at cursor %d (follow.max_tail_scan); earlier events of this selection may exist\n", from)
	}
	// Nothing printed yet and not resuming: everything up to the log's end
	// at subscription time has been considered, so a reconnect continues
	// after it instead of replaying the tail again.
	if f.resume == 0 && len(f.position) == 0 && req.GetAfterCursor() == 0 && len(req.GetAfterPosition()) == 0 {
		f.resume = mdUint(hdr, collector.HeaderLastCursor)
		f.position = mdBytes(hdr, collector.HeaderLastPosition)
	}
}

func (f *follower) warnLost(n, after uint64, more bool) {
	what, verb := "log records", "were"
	switch {
	case n == 1:
		what, verb = "1 log record", "was"
	case n > 1:
		what = fmt.Sprintf("%d log records", n)
	}
	if more {
		what = "another " + what
	}
	fmt.Fprintf(f.stderr, "eventpipe follow: WARNING: %s after cursor %d %s removed by the collector's retention before being read; events of this selection may be missing from the output\n", what, after, verb)
}

func (f *follower) printResume() {
	if len(f.position) > 0 {
		p := base64.RawURLEncoding.EncodeToString(f.position)
		fmt.Fprintf(f.stderr, "eventpipe follow: last position %s (resume with --after-position %s)\n", p, p)
		return
	}
	if f.resume > 0 {
		fmt.Fprintf(f.stderr, "eventpipe follow: last cursor %d (resume with --after %d)\n", f.resume, f.resume)
	}
}

func (f *follower) print(m *eventpipev1.FollowResponse) error {
	var line []byte
	if f.opts.output == "json" {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			return err
		}
		line = append(b, '\n')
	} else {
		multi := f.opts.sandbox == "" && f.opts.name == ""
		line = []byte(formatFollowLine(m, multi))
	}
	_, err := f.stdout.Write(line)
	return err
}

// tlsHint names the flag that fixes a failed TLS handshake.
func tlsHint(msg string) string {
	switch {
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return " (the collector speaks plaintext: pass --insecure)"
	case strings.Contains(msg, "certificate signed by unknown authority"):
		return " (pass --ca with the CA that signed the collector's certificate)"
	case strings.Contains(msg, "certificate is valid for"), strings.Contains(msg, "doesn't contain any IP SANs"):
		return " (pass --server-name with a name the certificate is valid for)"
	case strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate"):
		return " (the collector wants a client certificate: pass --cert and --key, or --token-file)"
	}
	return ""
}

// parseDataLoss reads the collector's DataLoss message: "<n> log records
// after cursor <c> were removed by retention ...".
func parseDataLoss(msg string) (n, after uint64) {
	fmt.Sscanf(msg, "%d log records after cursor %d", &n, &after)
	return n, after
}

// mdBytes is a binary (-bin) metadata value, nil when absent.
func mdBytes(md metadata.MD, key string) []byte {
	v := md.Get(key)
	if len(v) == 0 || v[0] == "" {
		return nil
	}
	return []byte(v[0])
}

// decodePosition reads --after-position (nil when empty).
func decodePosition(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

func mdUint(md metadata.MD, key string) uint64 {
	v := md.Get(key)
	if len(v) == 0 {
		return 0
	}
	n, _ := strconv.ParseUint(v[0], 10, 64)
	return n
}

func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}

// formatFollowLine renders one occurrence in the `openshell logs` style:
//
//	[<secs>.<ms>] [<source, width 7>] [<level, width 5>] [<target>] <message> k=v ...
//
// A pull failure's message leads with what failed and why ("workload image
// X: not_found"), followed by the runtime's own words; the raw kubelet
// message is in -o json. withSandbox adds sandbox=<name> for selectors that
// span several sandboxes.
func formatFollowLine(m *eventpipev1.FollowResponse, withSandbox bool) string {
	o := m.GetOccurrence()
	var b strings.Builder
	t := o.GetOccurredAt().AsTime()
	if o.GetOccurredAt() == nil {
		t = o.GetObservedAt().AsTime()
	}
	ms := t.UnixMilli()
	fmt.Fprintf(&b, "[%d.%03d] [%-7s] [%-5s] [%s] ", ms/1000, ms%1000, followSource(o.GetReportingComponent()), followLevel(o), followTarget(o))
	if pf := o.GetPullFailure(); pf != nil {
		img := pf.GetImage()
		if img == "" {
			img = o.GetImage()
		}
		role := o.GetImageRole()
		if role == "" {
			role = o.GetRole()
		}
		b.WriteString(sanitizeLine(fmt.Sprintf("%s image %s: %s", role, img, pf.GetCategory())))
		if d := pf.GetDetail(); d != "" {
			b.WriteString(" (")
			b.WriteString(sanitizeLine(d))
			b.WriteString(")")
		}
	} else {
		b.WriteString(sanitizeLine(o.GetMessage()))
	}
	if o.GetMessageTruncated() {
		b.WriteString(" [truncated]")
	}
	sep := b.Len() // no double space after an empty message
	kv := func(k, v string) {
		if v == "" {
			return
		}
		if b.Len() > sep || !strings.HasSuffix(b.String(), " ") {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(kvValue(v))
	}
	kv("reason", o.GetReason())
	if sb := o.GetSandbox(); sb.GetDeletedAt() != nil {
		// The sandbox was deleted (its deletion, or a late event of its old
		// pods): its name may belong to a new sandbox now, so say whose.
		kv("deleted_sandbox", sb.GetId())
	}
	if withSandbox {
		name := o.GetSandbox().GetName()
		if name == "" {
			name = o.GetSandbox().GetId()
		}
		kv("sandbox", name)
	}
	image := o.GetImage()
	if pf := o.GetPullFailure(); pf != nil {
		if pf.GetImage() != "" {
			image = pf.GetImage()
		}
		kv("image", image)
		kv("pull", pf.GetCategory())
		kv("confidence", pf.GetConfidence())
		kv("decided_by", pf.GetDecidedBy())
		kv("disposition", pf.GetDisposition())
	} else {
		kv("image", image)
	}
	if o.GetCount() > 1 {
		kv("count", strconv.Itoa(int(o.GetCount())))
	}
	kv("cursor", strconv.FormatUint(m.GetCursor(), 10))
	b.WriteByte('\n')
	return b.String()
}

// followSource is the component column: short names for the two components
// a user meets (kubelet, scheduler), "k8s" for every other one.
func followSource(component string) string {
	switch {
	case component == "default-scheduler":
		return "sched"
	case component != "" && len(component) <= 7 && isPlainWord(component):
		return component
	}
	return "k8s"
}

func isPlainWord(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// followLevel is WARN for Warning events and for any image-pull failure:
// kubelet reports "Back-off pulling image" as a Normal event, yet it is the
// line that explains why the sandbox is stuck.
func followLevel(o *eventpipev1.Occurrence) string {
	if o.GetType() == "Warning" || o.GetPullFailure() != nil {
		return "WARN"
	}
	return "INFO"
}

// followTarget is <role>/<container> when the event names a container,
// else <kind>/<name> of the involved object (kubectl's spelling).
func followTarget(o *eventpipev1.Occurrence) string {
	if c := o.GetContainer(); c != "" {
		role := o.GetRole()
		if role == "" || role == eventpipev1.RoleNone {
			role = strings.ToLower(o.GetInvolvedObject().GetKind())
		}
		return sanitizeLine(role + "/" + c)
	}
	obj := o.GetInvolvedObject()
	if obj.GetName() == "" {
		return "-"
	}
	return sanitizeLine(strings.ToLower(obj.GetKind()) + "/" + obj.GetName())
}

// sanitizeLine keeps one occurrence on one line and out of the terminal's
// control: the message comes from the cluster and is untrusted.
func sanitizeLine(s string) string {
	clean := true
	for _, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r) || r == utf8.RuneError:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// kvValue quotes a value that would not read back as one token.
func kvValue(v string) string {
	for _, r := range v {
		if r == ' ' || r == '"' || r == '=' || unicode.IsControl(r) || r == utf8.RuneError {
			return strconv.Quote(v)
		}
	}
	return v
}
