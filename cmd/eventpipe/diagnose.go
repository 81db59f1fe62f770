//go:build !agentonly

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/eventpipe/eventpipe/api/cliflag"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/remedy"
	"github.com/eventpipe/eventpipe/enrich/verify"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
)

func init() {
	register("diagnose", command{
		summary: "say what blocks a sandbox (image, scheduling, volume, creation, crashing container; cause, since when, the fix) from the collector",
		run:     runDiagnose,
	})
}

const diagnoseUsage = `Usage:
  eventpipe diagnose SANDBOX [-w WORKSPACE] [flags]   one sandbox, by name or id
  eventpipe diagnose -w WORKSPACE [flags]             every sandbox of a workspace
  eventpipe diagnose --gateway ID [flags]             every sandbox of a gateway
  eventpipe diagnose --supervisor [--gateway ID]      supervisor-image failures across a gateway

Says what keeps a sandbox from starting, from the collector alone (no
kubectl: only the collector's address and a reader token): which image
cannot be pulled and whether it is the sandbox's own (workload) image or the
gateway's supervisor image, or what else blocks it (kind: unschedulable,
volume, create_refused, container; the cause, e.g. insufficient_resources,
secret_not_found, quota_exceeded, oom_killed; the object the cause names and
the container's last exit code), how many attempts since when, whether
retrying may still help (retrying) or not (persistent), and the fix for that
cause:

  sandbox sup-bad  workspace repro  id 2ff21e26-1a7b-49a2-a640-14ae153f93ea  gateway openshell
  BLOCKED by 1 image pull failure:
    supervisor image ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist: not_found
      pod openshell-openshell-repro/os-supervisor-2ff21e26-..., container supervisor, node worker-1
      5 attempts since 2026-12-01T14:02:11Z (3m12s ago), persistent: retrying will not fix it
      runtime: ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist: not found
      fix: tag 0.0.0-does-not-exist does not exist in ghcr.io/nvidia/openshell/supervisor: check the supervisor image setting of the gateway

SANDBOX is a sandbox id (UUID) or a name. A name is unique only within a
workspace: with -w it is looked up there, without it across the sandboxes of
--gateway (an error lists the workspaces when several have that name). A
name stands for the sandbox that has it now: when a sandbox was deleted and
created again under its name (a new id), the old id's late events never
count for the new one; the old one is shown by its id, as DELETED (or
REPLACED, when its deletion was not seen) with what blocked it then, and
in a table as state deleted or replaced, with the id beside each name the
rows share.
--supervisor groups the supervisor-image failures of every sandbox of a
gateway, so a bad supervisor tag shows from the first failed sandbox on;
with the agent's supervisor-image check on (verify.supervisor), from
before the first sandbox ("blocks no sandbox yet", with the registry's
answer and where the image is set).

--verify asks the registry of each failing image, with your own registry
credentials as docker and crane find them (~/.docker/config.json,
DOCKER_CONFIG, credential helpers): does the tag exist, does the
repository, which tags do (newest by version), did it answer 429 and with
which limit, and with --platform os/arch whether the index carries the
nodes' platform. A conclusive answer replaces the cause and the fix and is
shown as verified ("registry (verified, certain, ...)"); an unreachable
registry or a timeout leaves the diagnosis as it was. Each image is asked
once per run, within 10s. Without --verify no registry is called.

  sandbox crash-loop  workspace repro  id 0c6f5a7e-...  gateway openshell
  BLOCKED by 1 blocker:
    container: oom_killed (Pod/crash-loop)
      pod openshell-openshell-repro/crash-loop, container agent, node worker-1
      3 attempts since 2026-12-01T14:02:11Z (1m05s ago), persistent: retrying will not fix it
      last exit code 137
      fix: container agent was killed for exceeding its memory limit: raise the sandbox's memory limit

The diagnosis folds the last --tail events of the selection; an image
blocker ends when the container's image is pulled (or the container is
created/started); the others when an event shows the pod got past that
stage (Scheduled; the claim provisioned or the pod scheduled or its
containers pulled; the pod created; a crashed container started and up for
a minute with no new crash). With several, supervisor image first, then by
stage: creation, claims, scheduling, volume mounts, images, containers.
eventpipe reports; it never stops, deletes or replaces a sandbox.

Examples:
  eventpipe diagnose --collector collector.eventpipe:7070 --ca ca.pem --token-file reader.token sup-bad -w repro
  eventpipe diagnose 2ff21e26-1a7b-49a2-a640-14ae153f93ea -o json | jq .blockers
  eventpipe diagnose --supervisor --gateway openshell --insecure
  eventpipe diagnose --verify --platform linux/arm64 sup-bad -w repro
  # watch a sandbox being created: a new diagnosis whenever it changes, until Ctrl-C
  eventpipe diagnose --watch sup-bad -w repro

Output (-o json): one object; one sandbox: the diagnosis {id, name,
workspace, gateway_id, state, blockers: [{kind, cause, image, image_role,
object, involved, exit_code, pod, container, node, disposition, attempts,
since, last_seen, detail, remedy, event_id, cursor, verified}], progress,
last_event, ...} (image and image_role for image pulls; object, involved
and exit_code for the other kinds, when known); a workspace or
gateway: {"sandboxes": [...]}; --supervisor: {"gateway_id", "supervisor_failures":
[{image, cause, disposition, attempts, since, last_seen, remedy, sandboxes,
verified}]} (verified: the agent's registry check, when one confirms it).

With --watch the diagnosis is printed again (after a "== <time>" line in
text, as one more JSON object with -o json) whenever it changes, resuming
after a lost stream, until Ctrl-C; the exit status is then that of the last
diagnosis printed.

Exit status:
  0  nothing blocks the sandbox (every sandbox of the selection; with
     --supervisor: no supervisor image fails to pull)
  1  blocked: at least one blocker of any kind (with --supervisor: a
     supervisor image fails)
  2  bad flags or connection settings, or an ambiguous name (use the id)
  3  the collector has no events of that sandbox (unknown name or id, or its
     workspace is not granted to the token)
  4  the collector cannot be reached (or did not answer within --timeout)
  5  the collector refused the credentials or the token's grants
  6  another error of the collector (its log says more), or output not written
The same statuses for every command: docs/cli.md.

Flags:
`

// Exit statuses of eventpipe diagnose.
const (
	diagnoseClear    = exitOK
	diagnoseBlocked  = exitFailed
	diagnoseBadUsage = exitUsage
	diagnoseUnknown  = exitNotFound
)

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

type diagnoseOptions struct {
	conn       followOptions
	workspace  string
	gateway    string
	supervisor bool
	tail       uint
	output     string
	sandbox    string
	timeout    time.Duration
	watch      bool
	verify     bool
	platform   string
}

// diagnoseWatchTick: how often --watch looks again without a new event.
const diagnoseWatchTick = 5 * time.Second

// diagnoseNow is the clock (tests pin it).
var diagnoseNow = time.Now

func runDiagnose(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	var o diagnoseOptions
	fs := flag.NewFlagSet("eventpipe diagnose", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.conn.connFlags(fs)
	fs.StringVar(&o.workspace, "workspace", "", "the sandbox's workspace (or, alone, every sandbox of it)")
	fs.StringVar(&o.workspace, "w", "", "shorthand for --workspace")
	fs.StringVar(&o.gateway, "gateway", "", "gateway id: every sandbox of it; where a name without -w and --supervisor look (default openshell there)")
	fs.BoolVar(&o.supervisor, "supervisor", false, "group supervisor-image failures across the sandboxes of --gateway")
	fs.UintVar(&o.tail, "tail", 2000, "fold the last N events of the selection")
	fs.StringVar(&o.output, "output", "text", "output format: text or json (table is another name of text)")
	fs.StringVar(&o.output, "o", "text", "shorthand for --output")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up reading from the collector after this long (not with --watch)")
	fs.BoolVar(&o.watch, "watch", false, "follow live: print the diagnosis again whenever it changes, until Ctrl-C")
	fs.BoolVar(&o.verify, "verify", false, "ask each failing image's registry (with your docker/crane credentials) whether the tag, repository and platform exist")
	fs.StringVar(&o.platform, "platform", "", "with --verify: the nodes' platform (os/arch[/variant]) the image must carry")
	fs.Usage = func() {
		fmt.Fprint(stderr, diagnoseUsage)
		fs.PrintDefaults()
	}
	// Flags may follow the sandbox: eventpipe diagnose sup-bad -w repro.
	var pos []string
	rest := args
	for {
		if exit, ok := parseFlags(fs, "diagnose", rest, stderr); !ok {
			return exit
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "eventpipe diagnose: one sandbox at a time, got %q\n", pos)
		return diagnoseBadUsage
	}
	if len(pos) == 1 {
		o.sandbox = pos[0]
	}
	if err := o.conn.resolveConn(fs); err != nil {
		fmt.Fprintf(stderr, "eventpipe diagnose: %v\n", err)
		return diagnoseBadUsage
	}
	if problems := o.validate(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "eventpipe diagnose: %s\n", p)
		}
		fmt.Fprintln(stderr, "run 'eventpipe diagnose --help' for usage")
		return diagnoseBadUsage
	}
	conn, err := o.conn.dial()
	if err != nil {
		fmt.Fprintf(stderr, "eventpipe diagnose: %v\n", err)
		return diagnoseBadUsage
	}
	defer conn.Close()
	d := &diagnoser{opts: o, client: eventpipev1.NewFollowClient(conn), stdout: stdout, stderr: stderr, ctx: ctx}
	if o.verify {
		// The user's own registry credentials, found as docker and crane
		// find them (~/.docker/config.json, credential helpers).
		if d.verifier, err = verify.New(verify.NewDefaultConfig(), verify.Options{Keychain: authn.DefaultKeychain}); err != nil {
			fmt.Fprintf(stderr, "eventpipe diagnose: %v\n", err)
			return diagnoseBadUsage
		}
	}
	return d.run(ctx)
}

func (o *diagnoseOptions) validate() []string {
	var p []string
	switch {
	case o.supervisor && (o.sandbox != "" || o.workspace != ""):
		p = append(p, "--supervisor looks across a gateway: pass --gateway ID, not a sandbox or -w")
	case o.sandbox == "" && o.workspace == "" && o.gateway == "" && !o.supervisor:
		p = append(p, "what to diagnose: pass a SANDBOX (name or id), -w WORKSPACE, --gateway ID or --supervisor")
	case o.sandbox == "" && o.workspace != "" && o.gateway != "":
		p = append(p, "-w and --gateway select differently: pass one")
	case o.sandbox != "" && uuidRE.MatchString(o.sandbox) && o.workspace != "":
		p = append(p, "a sandbox id needs no -w")
	}
	o.output = cliflag.Output(o.output)
	if o.output != "text" && o.output != "json" {
		p = append(p, fmt.Sprintf("--output must be text or json, got %q", o.output))
	}
	if o.tail == 0 || o.tail > 1<<32-1 {
		p = append(p, fmt.Sprintf("--tail must be between 1 and %d, got %d", uint32(1<<32-1), o.tail))
	}
	if o.timeout <= 0 {
		p = append(p, "--timeout must be positive")
	}
	if o.platform != "" && !o.verify {
		p = append(p, "--platform is what --verify compares: pass --verify too")
	} else if o.platform != "" && !strings.Contains(o.platform, "/") {
		p = append(p, fmt.Sprintf("--platform must be os/arch[/variant], got %q", o.platform))
	}
	return append(p, o.conn.connProblems()...)
}

type diagnoser struct {
	opts diagnoseOptions
	// checks: the agent's supervisor-image checks read with the selection.
	checks []diagnosis.SupervisorCheck
	// verifier asks registries (--verify); nil otherwise.
	verifier *verify.Verifier
	ctx      context.Context
	client   eventpipev1.FollowClient
	stdout   io.Writer
	stderr   io.Writer
}

func (d *diagnoser) gatewayOrDefault() string {
	if d.opts.gateway != "" {
		return d.opts.gateway
	}
	return "openshell"
}

// request is the Follow selection for the options.
func (d *diagnoser) request() *eventpipev1.FollowRequest {
	o := d.opts
	req := &eventpipev1.FollowRequest{Tail: uint32(o.tail)}
	switch {
	case o.supervisor:
		req.GatewayId = d.gatewayOrDefault()
	case o.sandbox != "" && uuidRE.MatchString(o.sandbox):
		req.SandboxId = strings.ToLower(o.sandbox)
	case o.sandbox != "" && o.workspace != "":
		req.Workspace, req.SandboxName = o.workspace, o.sandbox
	case o.sandbox != "":
		req.GatewayId = d.gatewayOrDefault()
	case o.workspace != "":
		req.Workspace = o.workspace
	default:
		req.GatewayId = o.gateway
	}
	return req
}

func (d *diagnoser) run(ctx context.Context) int {
	req := d.request()
	if d.opts.watch {
		return d.watch(ctx, req)
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.timeout)
	defer cancel()
	f, info, err := diagnosis.Read(ctx, d.client, req)
	if err != nil {
		return d.failed(err, req)
	}
	if info.TailScannedFrom > 0 {
		fmt.Fprintf(d.stderr, "eventpipe diagnose: note: the collector stopped looking for older events at cursor %d (follow.max_tail_scan); older blockers may be missing\n", info.TailScannedFrom)
	}
	if info.Read >= int(d.opts.tail) {
		fmt.Fprintf(d.stderr, "eventpipe diagnose: note: read the last %d events of the selection (--tail); a blocker whose last event is older is not shown\n", info.Read)
	}
	if n := f.Dropped(); n > 0 {
		fmt.Fprintf(d.stderr, "eventpipe diagnose: WARNING: %d events of further sandboxes were not folded (more than %d sandboxes)\n", n, f.MaxSandboxes)
	}
	all := f.Sandboxes()
	d.checks = f.SupervisorChecks()
	if req.SandboxId != "" && len(all) == 1 && all[0].Name != "" && all[0].Workspace != "" {
		// Its name may have passed to a newer sandbox: read the name too.
		byName, _, err := diagnosis.Read(ctx, d.client, &eventpipev1.FollowRequest{Workspace: all[0].Workspace, SandboxName: all[0].Name, Tail: req.Tail})
		if err != nil {
			fmt.Fprintf(d.stderr, "eventpipe diagnose: note: could not read the other sandboxes named %s: %v\n", all[0].Name, status.Convert(err).Message())
		} else {
			all[0] = diagnosis.Successor(all[0], byName)
		}
	}
	code, _ := d.report(all, req)
	return code
}

// watch follows the selection live and prints the diagnosis again whenever
// it changes, until ctx ends; it returns the status of the last one.
func (d *diagnoser) watch(ctx context.Context, req *eventpipev1.FollowRequest) int {
	w, err := diagnosis.NewWatcher(d.client, req, diagnosis.WatchOptions{})
	if err != nil {
		fmt.Fprintf(d.stderr, "eventpipe diagnose: %v\n", err)
		return exitError
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	code, last, connected := diagnoseUnknown, "", true
	// A crashed container's blocker ends by time (it stays up): look again
	// now and then, not only when an event arrives.
	tick := time.NewTicker(diagnoseWatchTick)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return d.failed(err, req)
			}
			return code
		case <-w.Changed():
		case <-tick.C:
		}
		st := w.Status()
		if st.Connected != connected {
			connected = st.Connected
			if !connected {
				fmt.Fprintf(d.stderr, "eventpipe diagnose: lost the stream from the collector at %s (%s); resubscribing\n", d.opts.conn.addr, st.LastError)
			}
		}
		if !st.Connected && st.Cursor == 0 {
			continue // not subscribed yet
		}
		all := w.Sandboxes()
		d.checks = w.SupervisorChecks()
		key := watchKey(d.selected(all, req))
		for _, c := range d.checks {
			key += fmt.Sprintf("|check %s %s %t %s", c.GatewayID, c.Image, c.OK, c.Cause)
		}
		if key == last {
			continue
		}
		last = key
		if d.opts.sandbox != "" && key == "" {
			fmt.Fprintf(d.stderr, "eventpipe diagnose: no events of sandbox %s yet%s; waiting\n", d.opts.sandbox, d.unknownHint(req))
			continue
		}
		if d.opts.output == "text" {
			fmt.Fprintf(d.stdout, "== %s\n", diagnoseNow().Format(time.RFC3339))
		}
		var stop bool
		if code, stop = d.report(all, req); stop {
			cancel()
			<-done
			return code
		}
	}
}

// selected is the part of all the options ask about. A name stands for
// the sandbox that has it now: an older sandbox of that name (deleted, or
// replaced by a newer id in its workspace) is left out; it is reachable by
// its id.
func (d *diagnoser) selected(all []diagnosis.Diagnosis, req *eventpipev1.FollowRequest) []diagnosis.Diagnosis {
	if d.opts.sandbox == "" {
		return all
	}
	var out []diagnosis.Diagnosis
	for _, sb := range all {
		if (req.SandboxId != "" && sb.ID == req.SandboxId) ||
			(req.SandboxId == "" && sb.Name == d.opts.sandbox && sb.ReplacedBy == "" && (d.opts.workspace == "" || sb.Workspace == d.opts.workspace)) {
			out = append(out, sb)
		}
	}
	return out
}

// ambiguous says which sandboxes a name stands for when it names several
// current ones (in several workspaces of a gateway, or, with -w, of
// several gateways), and how to pick one: only what tells them apart.
func (d *diagnoser) ambiguous(matches []diagnosis.Diagnosis, req *eventpipev1.FollowRequest) string {
	var picks []string
	if req.Workspace == "" {
		for _, m := range matches {
			picks = append(picks, fmt.Sprintf("-w %s (id %s)", m.Workspace, m.ID))
		}
		return fmt.Sprintf("%d sandboxes of gateway %s are named %s: pass %s, or the id",
			len(matches), req.GatewayId, d.opts.sandbox, orList(picks))
	}
	for _, m := range matches {
		gw := m.GatewayID
		if gw == "" {
			gw = "unknown"
		}
		picks = append(picks, fmt.Sprintf("%s (gateway %s)", m.ID, gw))
	}
	return fmt.Sprintf("%d sandboxes of workspace %s are named %s, of different gateways: pass the id, %s",
		len(matches), req.Workspace, d.opts.sandbox, orList(picks))
}

// orList joins "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// watchKey changes when what report prints changes (not with the clock).
func watchKey(ds []diagnosis.Diagnosis) string {
	var b strings.Builder
	for _, s := range ds {
		fmt.Fprintf(&b, "%s|%s|%s;", s.ID, s.Name, s.State)
		for _, bl := range s.Blockers {
			fmt.Fprintf(&b, "%s|%s|%s|%s|%s|%s|%s|%s|%d", bl.Kind, bl.Image, bl.ImageRole, bl.Object, bl.Container, bl.Remedy, bl.Cause, bl.Disposition, bl.Attempts)
			if bl.ExitCode != nil {
				fmt.Fprintf(&b, "|%d", *bl.ExitCode)
			}
			b.WriteByte(',')
		}
	}
	return b.String()
}

// report prints the diagnosis of the selection out of all and returns the
// exit status; stop is set when watching cannot go on (an ambiguous name).
func (d *diagnoser) report(all []diagnosis.Diagnosis, req *eventpipev1.FollowRequest) (code int, stop bool) {
	o := d.opts
	d.verifyImages(all)
	now := diagnoseNow()
	switch {
	case o.supervisor:
		groups := diagnosis.WithChecks(diagnosis.Supervisor(all), d.checks)
		if err := d.write(struct {
			GatewayID          string                        `json:"gateway_id"`
			SupervisorFailures []diagnosis.SupervisorFailure `json:"supervisor_failures"`
		}{req.GatewayId, groups}, func(w io.Writer) error { return diagnosis.WriteSupervisor(w, groups, now) }); err != nil {
			return d.writeFailed(err), true
		}
		if len(groups) > 0 {
			return diagnoseBlocked, false
		}
		return diagnoseClear, false
	case o.sandbox != "":
		matches := d.selected(all, req)
		switch len(matches) {
		case 0:
			fmt.Fprintf(d.stderr, "eventpipe diagnose: the collector has no events of sandbox %s%s\n", o.sandbox, d.unknownHint(req))
			return diagnoseUnknown, false
		case 1:
		default:
			fmt.Fprintf(d.stderr, "eventpipe diagnose: %s\n", d.ambiguous(matches, req))
			return diagnoseBadUsage, true
		}
		sb := matches[0]
		if err := d.write(sb, func(w io.Writer) error { return diagnosis.WriteText(w, sb, now) }); err != nil {
			return d.writeFailed(err), true
		}
		if sb.Blocked() {
			return diagnoseBlocked, false
		}
		return diagnoseClear, false
	default:
		if err := d.write(struct {
			Sandboxes []diagnosis.Diagnosis `json:"sandboxes"`
		}{all}, func(w io.Writer) error {
			if len(all) == 0 {
				_, err := fmt.Fprintln(w, "the collector has no events of this selection")
				return err
			}
			return diagnosis.WriteTable(w, all, now)
		}); err != nil {
			return d.writeFailed(err), true
		}
		if len(all) == 0 {
			return diagnoseUnknown, false
		}
		for _, sb := range all {
			if sb.Blocked() {
				return diagnoseBlocked, false
			}
		}
		return diagnoseClear, false
	}
}

func (d *diagnoser) unknownHint(req *eventpipev1.FollowRequest) string {
	switch {
	case req.SandboxId != "":
		return " (is the id right? a reader token sees only the workspaces it was granted)"
	case req.Workspace != "":
		return fmt.Sprintf(" in workspace %s (is the name right? pass the id, or check -w)", req.Workspace)
	}
	return fmt.Sprintf(" among the sandboxes of gateway %s: pass -w WORKSPACE (or --gateway ID, or the sandbox id)", req.GatewayId)
}

func (d *diagnoser) write(v any, text func(io.Writer) error) error {
	if d.opts.output == "json" {
		enc := json.NewEncoder(d.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return text(d.stdout)
}

func (d *diagnoser) writeFailed(err error) int {
	fmt.Fprintf(d.stderr, "eventpipe diagnose: write output: %v\n", err)
	return exitError
}

// failed explains a failed read (reusing follow's wording for refusals).
func (d *diagnoser) failed(err error, req *eventpipev1.FollowRequest) int {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable:
		fmt.Fprintf(d.stderr, "eventpipe diagnose: collector at %s is not reachable: %s%s\n", d.opts.conn.addr, st.Message(), tlsHint(st.Message()))
	case codes.DeadlineExceeded:
		fmt.Fprintf(d.stderr, "eventpipe diagnose: no answer from the collector at %s within %s (--timeout)\n", d.opts.conn.addr, d.opts.timeout)
	default:
		fo := d.opts.conn
		fo.sandbox, fo.workspace, fo.gw = req.GetSandboxId(), req.GetWorkspace(), req.GetGatewayId()
		fmt.Fprintf(d.stderr, "eventpipe diagnose: %s\n", (&follower{opts: fo}).explain(st))
	}
	return collectorExit(st.Code())
}

// verifyImages asks the registry of every failing image (--verify) and
// upgrades the blocker's cause and fix with a conclusive answer; the
// answer is shown either way. Each image is asked once per run (the
// verifier's cache), every call bounded by its timeout.
func (d *diagnoser) verifyImages(all []diagnosis.Diagnosis) {
	if d.verifier == nil {
		return
	}
	for i := range all {
		for j := range all[i].Blockers {
			bl := &all[i].Blockers[j]
			if bl.Kind != diagnosis.KindImagePull || bl.Image == "" {
				continue
			}
			r := d.verifier.Check(d.ctx, bl.Image, d.opts.platform)
			v := &diagnosis.Verification{Answer: r.Answer, Detail: r.Detail, Tags: r.Tags, Platforms: r.Platforms,
				Anonymous: r.Anonymous, CheckedAt: r.CheckedAt}
			if r.Conclusive() {
				v.DecidedBy, v.Confidence = eventpipev1.DecidedByRegistry, r.Confidence()
				bl.Cause, bl.DecidedBy, bl.Confidence = r.Category, v.DecidedBy, v.Confidence
				bl.Remedy = remedy.Pull(remedy.Input{Category: r.Category, Image: bl.Image, ImageRole: bl.ImageRole, Node: bl.Node, Detail: r.Detail})
				if len(r.Tags) > 0 {
					bl.Remedy += " (newest tags by version: " + strings.Join(r.Tags, ", ") + ")"
				}
				pf := &eventpipev1.PullFailure{}
				r.Apply(pf)
				bl.Disposition = pf.Disposition
			}
			bl.Verified = v
		}
	}
}
