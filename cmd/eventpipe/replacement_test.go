//go:build !agentonly

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector"
)

// Sandbox web of workspace repro was deleted and created again: the old id
// has a persistent pull failure whose late Events keep arriving after the
// new, healthy id's; the reproduction (issue 25 item 4).
const (
	webOldID = "0d1e2f30-4152-4637-8495-a6b7c8d9e0f1"
	webNewID = "9a8b7c6d-5e4f-4031-9213-243546576879"
	// The same story in workspace missed, where the deletion was not seen.
	missedOldID = "0e1e2f30-4152-4637-8495-a6b7c8d9e0f1"
	missedNewID = "9b8b7c6d-5e4f-4031-9213-243546576879"
)

// webOcc is an occurrence of sandbox web (id) at fT0+at, cursor order n.
func webOcc(n int, id, ws, gw string, at time.Duration, typ, reason, container, msg string) *eventpipev1.Occurrence {
	o := fOcc(n, at, typ, reason, "kubelet", container, msg)
	o.EventId = fmt.Sprintf("%s-%02d/%d", id[:8], n, 9000+n)
	o.InvolvedObject.Name, o.InvolvedObject.Uid = "web", id[:8]+"-pod"
	o.Sandbox = &eventpipev1.Sandbox{Id: id, Name: "web", Workspace: ws, GatewayId: gw, CrNamespace: "openshell-" + gw + "-" + ws, CrName: "web"}
	return o
}

// replacedWeb: the old id fails to pull (cursors 1-3), the new id starts
// (4-6), deletion (7, when deletion is set) and late failures of the old
// id (8-9, marked deleted when deletion is set, as the agent attributes
// them through the CR it remembers).
func replacedWeb(ws, oldID, newID string, deletion bool) []*eventpipev1.Occurrence {
	pullMsg := `Failed to pull image "` + fImage + `": rpc error: code = NotFound desc = ` + fImage + `: not found`
	fail := func(n int, at time.Duration, attempts uint32) *eventpipev1.Occurrence {
		o := withPull(webOcc(n, oldID, ws, "openshell", at, "Warning", "Failed", "workspace-init", pullMsg), int32(attempts), attempts)
		o.PullFailure.Disposition = eventpipev1.DispositionPersistent
		return o
	}
	deletedAt := fT0.Add(2 * time.Minute)
	occs := []*eventpipev1.Occurrence{
		fail(1, 10*time.Second, 1), fail(2, 40*time.Second, 3), fail(3, 90*time.Second, 5),
		webOcc(4, newID, ws, "openshell", 150*time.Second, "Normal", "Scheduled", "", "Successfully assigned web"),
		webOcc(5, newID, ws, "openshell", 152*time.Second, "Normal", "Pulled", "workspace-init", "Container image already present on machine"),
		webOcc(6, newID, ws, "openshell", 153*time.Second, "Normal", "Started", "agent", "Started container agent"),
	}
	if deletion {
		d := webOcc(7, oldID, ws, "openshell", 2*time.Minute, "Normal", eventpipev1.ReasonSandboxDeleted, "", "Sandbox web was deleted")
		d.EventId, d.ReportingComponent = eventpipev1.DeletionEventIDPrefix+"old-cr-uid", eventpipev1.ComponentAgent
		d.InvolvedObject = &eventpipev1.ObjectRef{Kind: "Sandbox", Namespace: d.Sandbox.CrNamespace, Name: "web", Uid: "old-cr-uid"}
		d.Sandbox.DeletedAt = timestamppb.New(deletedAt)
		occs = append(occs, d)
	}
	for _, o := range []*eventpipev1.Occurrence{fail(8, 160*time.Second, 6), fail(9, 200*time.Second, 7)} {
		if deletion {
			o.Sandbox.DeletedAt = timestamppb.New(deletedAt)
		}
		occs = append(occs, o)
	}
	return occs
}

// `eventpipe diagnose NAME` answers about the sandbox that has the name now;
// the old id is reachable by its id and says it was deleted (or replaced);
// the table shows both with their ids; only the live one decides the exit
// status.
func TestDiagnoseReplacedSandbox(t *testing.T) {
	defer goleak.VerifyNone(t)
	old := diagnoseNow
	diagnoseNow = func() time.Time { return fT0.Add(5 * time.Minute) }
	defer func() { diagnoseNow = old }()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "all-tokens.yaml")
	if err := os.WriteFile(tokens, []byte(fTokensYAML+"- {token: reader-all-0123456789, name: carol, role: reader, workspaces: [\"*\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "all.token"), []byte("reader-all-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startFollowCollector(t, dir, "127.0.0.1:0", func(c *collector.Config) { c.Auth.TokensFile = tokens })
	defer f.stop(t)
	var occs []*eventpipev1.Occurrence
	occs = append(occs, replacedWeb("repro", webOldID, webNewID, true)...)
	missed := replacedWeb("missed", missedOldID, missedNewID, false) // the deletion was not seen
	for _, o := range missed {
		o.EventId = "m-" + o.EventId
	}
	occs = append(occs, missed...)
	// dup: one live sandbox in each of two workspaces; dupgw: in one
	// workspace, of two gateways.
	dup := func(n int, id, ws, gw string) *eventpipev1.Occurrence {
		o := webOcc(n, id, ws, gw, time.Minute, "Normal", "Scheduled", "", "Successfully assigned")
		o.Sandbox.Name, o.EventId = "dup", "dup-"+o.EventId
		return o
	}
	occs = append(occs,
		dup(30, "11111111-1111-4111-8111-111111111111", "a", "openshell"),
		dup(31, "22222222-2222-4222-8222-222222222222", "b", "openshell"),
		dup(32, "33333333-3333-4333-8333-333333333333", "c", "gw-one"),
		dup(33, "44444444-4444-4444-8444-444444444444", "c", "gw-two"))
	f.ingest(t, 1, "100", occs...)
	conn := []string{"--collector", f.addr, "--insecure", "--token-file", f.token("all")}

	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
		absent   []string
		stderr   string
	}{
		{"by name: the new id", []string{"web", "-w", "repro"}, 0,
			[]string{"sandbox web  workspace repro  id " + webNewID + "  gateway openshell\nnothing blocks it: last event Started"},
			[]string{webOldID, "BLOCKED"}, ""},
		{"by the old id: deleted, and what blocked it", []string{webOldID}, 0,
			[]string{"id " + webOldID, "DELETED at 2026-10-29T10:12:36Z (3m00s ago); the name web is now sandbox id " + webNewID,
				"what blocked it when last seen (1):\n  workload image " + fImage + ": not_found"},
			nil, ""},
		{"by the new id", []string{webNewID}, 0, []string{"id " + webNewID + "  gateway openshell\nnothing blocks it"}, nil, ""},
		{"deletion missed: the newer id has the name", []string{"web", "-w", "missed"}, 0,
			[]string{"id " + missedNewID}, []string{missedOldID}, ""},
		{"deletion missed, by the old id: replaced", []string{missedOldID}, 0,
			[]string{"REPLACED (its deletion was not seen); the name web is now sandbox id " + missedNewID}, nil, ""},
		{"deletion missed, by the old id, json", []string{missedOldID, "-o", "json"}, 0,
			[]string{`"state": "replaced"`, `"replaced_by": "` + missedNewID + `"`}, []string{"deleted_at"}, ""},
		{"table: both ids, the old one deleted", []string{"-w", "repro"}, 0,
			[]string{"web (id " + webOldID + ")  repro      deleted", "web (id " + webNewID + ")  repro      clear"},
			[]string{"BLOCKED", "fix web"}, ""},
		{"table, deletion missed: replaced", []string{"-w", "missed"}, 0,
			[]string{"web (id " + missedOldID + ")  missed     replaced", "web (id " + missedNewID + ")  missed     clear"}, nil, ""},
		{"one name in two workspaces", []string{"dup"}, 2, nil, nil,
			"eventpipe diagnose: 2 sandboxes of gateway openshell are named dup: pass -w a (id 11111111-1111-4111-8111-111111111111) or -w b (id 22222222-2222-4222-8222-222222222222), or the id\n"},
		{"one name in one workspace of two gateways", []string{"dup", "-w", "c"}, 2, nil, nil,
			"eventpipe diagnose: 2 sandboxes of workspace c are named dup, of different gateways: pass the id, 33333333-3333-4333-8333-333333333333 (gateway gw-one) or 44444444-4444-4444-8444-444444444444 (gateway gw-two)\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runDiagnoseCmd(append(conn, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stdout:\n%s\nstderr: %s", code, tc.code, out, errOut)
			}
			for _, c := range tc.contains {
				if !strings.Contains(out, c) {
					t.Errorf("stdout lacks %q:\n%s", c, out)
				}
			}
			for _, c := range tc.absent {
				if strings.Contains(out, c) {
					t.Errorf("stdout has %q:\n%s", c, out)
				}
			}
			if errOut != tc.stderr {
				t.Errorf("stderr %q, want %q", errOut, tc.stderr)
			}
		})
	}
	// -o json by name: the new id.
	code, out, _ := runDiagnoseCmd(append(conn, "web", "-w", "missed", "-o", "json")...)
	var d struct{ ID, State string }
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.ID != missedNewID || d.State != "clear" {
		t.Errorf("json by name: exit %d, %+v (%v)", code, d, err)
	}
}

// In a follow by name, the lines of the deleted sandbox say whose they
// are; the new sandbox's lines do not.
func TestFollowLineOfDeletedSandbox(t *testing.T) {
	occs := replacedWeb("repro", webOldID, webNewID, true)
	for _, tc := range []struct {
		o    *eventpipev1.Occurrence
		want string
	}{
		{occs[1], ""}, // before the deletion
		{occs[4], ""}, // the new id
		{occs[6], "reason=SandboxDeleted deleted_sandbox=" + webOldID},
		{occs[7], "reason=Failed deleted_sandbox=" + webOldID},
	} {
		line := formatFollowLine(&eventpipev1.FollowResponse{Cursor: 1, Occurrence: tc.o}, false)
		if tc.want == "" && strings.Contains(line, "deleted_sandbox") || !strings.Contains(line, tc.want) {
			t.Errorf("%s %s: %s", tc.o.GetSandbox().GetId(), tc.o.GetReason(), line)
		}
	}
}
