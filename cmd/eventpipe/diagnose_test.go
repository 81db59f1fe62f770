//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

const (
	supImage = "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"
	supBadID = "5d0c7f6e-8b1a-4c3d-9e2f-0a1b2c3d4e5f"
	supTwoID = "6e1d8a7f-9c2b-4d4e-8f3a-1b2c3d4e5f60"
)

// supervisorFailure is the seed sup-bad: the supervisor pod's image tag does
// not exist (as enrich emits it for the newer generation).
func supervisorFailure(n int, id, name string, attempts uint32, disp string) *eventpipev1.Occurrence {
	msg := `Failed to pull image "` + supImage + `": rpc error: code = NotFound desc = failed to pull and unpack image "` + supImage + `": failed to resolve reference "` + supImage + `": ` + supImage + `: not found`
	o := fOcc(n, time.Duration(n)*time.Second, "Warning", "Failed", "kubelet", "", msg)
	pod := "os-supervisor-" + id
	o.EventId = fmt.Sprintf("%s/%d", id, 7000+n)
	o.InvolvedObject = &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: fNamespace, Name: pod,
		Uid: id[:8] + "-0000-4000-8000-000000000000", FieldPath: "spec.containers{supervisor}"}
	o.Sandbox = &eventpipev1.Sandbox{Id: id, Name: name, Workspace: "repro", GatewayId: "openshell", CrNamespace: fNamespace, CrName: name}
	o.Attribution, o.Role, o.Container = eventpipev1.AttributionSupervisorName, eventpipev1.RoleSupervisor, "supervisor"
	o.Image, o.ImageRole = supImage, eventpipev1.ImageRoleSupervisor
	o.PullFailure = &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Image: supImage, Disposition: disp,
		Attempts: attempts, FirstSeen: timestamppb.New(fT0.Add(time.Second)), LastSeen: o.OccurredAt,
		Detail: supImage + ": not found", Source: eventpipev1.PullSourceEvent}
	return o
}

func runDiagnoseCmd(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := realMain(append([]string{"diagnose"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestDiagnoseCommand(t *testing.T) {
	defer goleak.VerifyNone(t)
	old := diagnoseNow
	diagnoseNow = func() time.Time { return fT0.Add(5 * time.Minute) }
	defer func() { diagnoseNow = old }()
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	occs := seedOccurrences()
	occs = append(occs,
		supervisorFailure(20, supBadID, "sup-bad", 1, eventpipev1.DispositionRetrying),
		supervisorFailure(21, supBadID, "sup-bad", 5, eventpipev1.DispositionPersistent),
		supervisorFailure(22, supTwoID, "sup-two", 1, eventpipev1.DispositionRetrying))
	f.ingest(t, 1, "100", occs...)
	conn := []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro")}

	wantWorkload := "  workload image " + fImage + ": not_found\n"
	wantFixWorkload := "    fix: tag 0.0.0-does-not-exist does not exist in docker.io/library/busybox: check the image the sandbox was created with\n"
	wantSup := "  supervisor image " + supImage + ": not_found\n"
	wantFixSup := "fix: tag 0.0.0-does-not-exist does not exist in ghcr.io/nvidia/openshell/supervisor: check the supervisor image setting of the gateway\n"
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
		stderr   string
	}{
		{"by name and workspace", []string{"img-missing", "-w", "repro"}, 1, []string{
			"sandbox img-missing  workspace repro  id " + fSandboxID + "  gateway openshell\nBLOCKED by 1 image pull failure:\n",
			wantWorkload, "    pod openshell-openshell-repro/img-missing, container workspace-init, node koinon-osrepro-control-plane\n",
			"    4 attempts since 2026-10-29T10:10:38Z (4m58s ago), retrying: the kubelet keeps trying, it may clear on its own\n",
			"    runtime: " + fImage + ": not found\n", wantFixWorkload}, ""},
		{"by id", []string{fSandboxID}, 1, []string{wantWorkload, wantFixWorkload}, ""},
		{"by name across the gateway", []string{"sup-bad"}, 1, []string{wantSup,
			"    5 attempts since 2026-10-29T10:10:37Z (4m59s ago), persistent: retrying will not fix it\n", "    " + wantFixSup}, ""},
		{"supervisor across the gateway", []string{"--supervisor"}, 1, []string{
			"supervisor image " + supImage + " of gateway openshell: not_found\n  blocks 2 sandboxes: repro/sup-bad, repro/sup-two\n",
			"  6 attempts since", "persistent: retrying will not fix it", "  " + wantFixSup}, ""},
		{"workspace table", []string{"-w", "repro"}, 1, []string{"SANDBOX", "img-missing", "sup-bad", "sup-two",
			"fix img-missing (workload image): tag 0.0.0-does-not-exist"}, ""},
		{"unknown name", []string{"nope", "-w", "repro"}, 3, nil, "the collector has no events of sandbox nope in workspace repro"},
		{"unknown id", []string{"7e1d1c9a-6a43-4d8e-b7c4-3e2f2a1b0c9d"}, 3, nil, "a reader token sees only the workspaces it was granted"},
		{"name and id conflict", []string{fSandboxID, "-w", "repro"}, 2, nil, "a sandbox id needs no -w"},
		{"nothing to diagnose", nil, 2, nil, "what to diagnose"},
		{"two sandboxes", []string{"a", "b"}, 2, nil, "one sandbox at a time"},
		{"bad output", []string{"-o", "yaml", "x", "-w", "repro"}, 2, nil, "--output must be text or json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runDiagnoseCmd(append(append([]string{}, conn...), tt.args...)...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, out, errs)
			}
			for _, w := range tt.contains {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			if tt.stderr != "" && !strings.Contains(errs, tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, errs)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		code, out, errs := runDiagnoseCmd(append(append([]string{}, conn...), "sup-bad", "-w", "repro", "-o", "json")...)
		if code != 1 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		var d struct {
			ID, Name, Workspace, State string
			Blockers                   []struct {
				Cause, Image, Disposition, Remedy, Container, Pod string
				ImageRole                                         string `json:"image_role"`
				Attempts                                          int
				Since                                             time.Time
			}
		}
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		if d.ID != supBadID || d.State != "blocked" || len(d.Blockers) != 1 {
			t.Fatalf("json: %+v", d)
		}
		b := d.Blockers[0]
		if b.ImageRole != "supervisor" || b.Cause != "not_found" || b.Image != supImage || b.Disposition != "persistent" ||
			b.Attempts != 5 || !b.Since.Equal(fT0.Add(time.Second)) || b.Container != "supervisor" || "fix: "+b.Remedy+"\n" != wantFixSup {
			t.Errorf("json blocker: %+v", b)
		}
		code, out, _ = runDiagnoseCmd(append(append([]string{}, conn...), "--supervisor", "-o", "json")...)
		var s struct {
			GatewayID          string `json:"gateway_id"`
			SupervisorFailures []struct {
				Image     string
				Sandboxes []struct{ ID, Name string }
			} `json:"supervisor_failures"`
		}
		if err := json.Unmarshal([]byte(out), &s); err != nil || code != 1 || s.GatewayID != "openshell" ||
			len(s.SupervisorFailures) != 1 || len(s.SupervisorFailures[0].Sandboxes) != 2 {
			t.Errorf("supervisor json (exit %d, err %v): %s", code, err, out)
		}
	})

	t.Run("a sandbox whose image was pulled is clear", func(t *testing.T) {
		pulled := fOcc(30, 20*time.Second, "Normal", "Pulled", "kubelet", "workspace-init", `Successfully pulled image "`+fImage+`" in 1.1s`)
		f.ingest(t, 2, "101", pulled)
		code, out, errs := runDiagnoseCmd(append(append([]string{}, conn...), "img-missing", "-w", "repro")...)
		if code != 0 || !strings.Contains(out, "nothing blocks it: last event Pulled pod/img-missing (workspace-init)") {
			t.Errorf("exit %d\n%s%s", code, out, errs)
		}
	})

	t.Run("refusals and an unreachable collector", func(t *testing.T) {
		code, _, errs := runDiagnoseCmd("--collector", f.addr, "--insecure", "--token-file", f.token("wrong"), "img-missing", "-w", "repro")
		if code != exitRefused || !strings.Contains(errs, "refused the credentials") {
			t.Errorf("wrong token: exit %d: %s", code, errs)
		}
		code, _, errs = runDiagnoseCmd("--collector", f.addr, "--insecure", "--token-file", f.token("other"), "img-missing", "-w", "repro")
		if code != exitRefused || !strings.Contains(errs, `does not allow these credentials to follow workspace "repro"`) {
			t.Errorf("other workspace: exit %d: %s", code, errs)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := l.Addr().String()
		l.Close()
		code, _, errs = runDiagnoseCmd("--collector", dead, "--insecure", "--timeout", "5s", fSandboxID)
		if code != exitUnreachable || !strings.Contains(errs, "is not reachable") {
			t.Errorf("unreachable: exit %d: %s", code, errs)
		}
	})
}

// --watch prints a new diagnosis as the sandbox's events arrive (blocked,
// then clear once the image is pulled) and exits on Ctrl-C with the last
// one's status; a refused token ends it with 2.
func TestDiagnoseCommandWatch(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	occs := seedOccurrences()
	f.ingest(t, 1, "100", occs[0], occs[1])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runDiagnose(ctx, []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro"), "--watch", "img-missing", "-w", "repro"}, nil, &out, &errb)
	}()
	waitFor(t, &out, "nothing blocks it: last event ")
	f.ingest(t, 2, "101", occs[2])
	waitFor(t, &out, "  workload image "+fImage+": not_found\n")
	pulled := fOcc(30, 20*time.Second, "Normal", "Pulled", "kubelet", "workspace-init", `Successfully pulled image "`+fImage+`" in 1.1s`)
	f.ingest(t, 3, "102", pulled)
	waitFor(t, &out, "nothing blocks it: last event Pulled")
	if n := strings.Count(out.String(), "== "); n != 3 {
		t.Errorf("%d diagnoses printed, want 3 (one per change):\n%s", n, out.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d after Ctrl-C with a clear sandbox, want 0; stderr %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("--watch did not stop")
	}

	var errb2 syncBuffer
	code := runDiagnose(context.Background(), []string{"--collector", f.addr, "--insecure", "--token-file", f.token("other"), "--watch", "-w", "repro"}, nil, io.Discard, &errb2)
	if code != exitRefused || !strings.Contains(errb2.String(), "does not allow these credentials") {
		t.Errorf("refused --watch: exit %d: %s", code, errb2.String())
	}
}

const crashID = "7f2e9b80-ad3c-4e5f-9a4b-2c3d4e5f6071"

// crashLoop is a sandbox whose agent container is OOM-killed again and
// again, as the agent diagnoses it from the pod status (the fix is
// enrich's own).
func crashLoop(n int, restarts uint32, disp string) *eventpipev1.Occurrence {
	o := fOcc(n, time.Duration(n)*time.Second, "Warning", "CrashLoopBackOff", "eventpipe-agent", "agent",
		"back-off 40s restarting failed container=agent pod=crash-loop_"+fNamespace+"(9a8b7c6d-0000-4000-8000-000000000000)")
	o.EventId = fmt.Sprintf("9a8b7c6d-0000-4000-8000-000000000000/%d/agent", 8000+n)
	o.InvolvedObject = &eventpipev1.ObjectRef{Kind: "Pod", ApiVersion: "v1", Namespace: fNamespace, Name: "crash-loop",
		Uid: "9a8b7c6d-0000-4000-8000-000000000000", FieldPath: "spec.containers{agent}"}
	o.Sandbox = &eventpipev1.Sandbox{Id: crashID, Name: "crash-loop", Workspace: "repro", GatewayId: "openshell", CrNamespace: fNamespace, CrName: "crash-loop"}
	o.Blocker = &eventpipev1.Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerOOMKilled, Object: "Pod/crash-loop",
		Container: "agent", Disposition: disp, Attempts: restarts, FirstSeen: timestamppb.New(fT0.Add(time.Second)), LastSeen: o.OccurredAt,
		Detail: "back-off 40s restarting failed container", Source: eventpipev1.PullSourcePodStatus, ExitCode: 137, HasExitCode: true}
	o.Blocker.Fix = enrich.BlockerFix(o.Blocker)
	return o
}

// Blockers other than images: text and JSON name the kind, cause, object,
// container, exit code and fix; the exit status is 1.
func TestDiagnoseCommandOtherBlockers(t *testing.T) {
	defer goleak.VerifyNone(t)
	old := diagnoseNow
	diagnoseNow = func() time.Time { return fT0.Add(5 * time.Minute) }
	defer func() { diagnoseNow = old }()
	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	f.ingest(t, 1, "100", crashLoop(40, 2, eventpipev1.DispositionRetrying), crashLoop(41, 4, eventpipev1.DispositionPersistent))
	conn := []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro")}
	fix := crashLoop(0, 4, eventpipev1.DispositionPersistent).GetBlocker().GetFix()
	if fix == "" {
		t.Fatal("enrich has no fix for oom_killed")
	}

	code, out, errs := runDiagnoseCmd(append(append([]string{}, conn...), "crash-loop", "-w", "repro")...)
	if code != 1 {
		t.Errorf("exit %d, want 1: %s", code, errs)
	}
	for _, w := range []string{"BLOCKED by 1 blocker:\n", "  container: oom_killed (Pod/crash-loop)\n",
		"    pod openshell-openshell-repro/crash-loop, container agent\n", "4 attempts since", "persistent: retrying will not fix it",
		"    last exit code 137\n", "    fix: " + fix + "\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("text lacks %q:\n%s", w, out)
		}
	}
	code, out, _ = runDiagnoseCmd(append(append([]string{}, conn...), "-w", "repro")...)
	if code != 1 || !strings.Contains(out, "fix crash-loop (container, container agent): "+fix) || !strings.Contains(out, "container agent exit 137") {
		t.Errorf("table (exit %d):\n%s", code, out)
	}

	code, out, errs = runDiagnoseCmd(append(append([]string{}, conn...), crashID, "-o", "json")...)
	if code != 1 {
		t.Fatalf("json: exit %d: %s", code, errs)
	}
	var d struct {
		State    string
		Blockers []struct {
			Kind, Cause, Object, Container, Remedy, Disposition string
			ExitCode                                            *int32 `json:"exit_code"`
			Image                                               *string
		}
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if d.State != "blocked" || len(d.Blockers) != 1 {
		t.Fatalf("json: %+v", d)
	}
	b := d.Blockers[0]
	if b.Kind != "container" || b.Cause != "oom_killed" || b.Object != "Pod/crash-loop" || b.Container != "agent" ||
		b.ExitCode == nil || *b.ExitCode != 137 || b.Remedy != fix || b.Disposition != "persistent" || b.Image != nil {
		t.Errorf("json blocker: %+v", b)
	}
}
