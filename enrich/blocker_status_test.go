package enrich

import (
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestDiagnosePodTerminated: a container whose current state is terminated
// and that waits for nothing (restartPolicy Never, a failed init container:
// kubectl's Init:Error) is a blocker when it was OOMKilled, could not
// start, or exited non-zero, with the termination in detail and the exit
// code; Completed with code 0, and a running container whose only
// termination is lastState's, are none. The reasons and codes are the
// kubelet's (ContainerStateTerminated: OOMKilled 137, Error with the
// program's code, ContainerCannotRun/StartError with the runtime's 128).
func TestDiagnosePodTerminated(t *testing.T) {
	tests := []struct {
		name      string
		container int // index in seedPod: 3 workspace-init (init), 4 agent
		reason    string
		code      int32
		current   bool
		cause     string // "" = no occurrence
		detail    string
	}{
		{"OOMKilled, restartPolicy Never", 4, "OOMKilled", 137, true, eventpipev1.BlockerOOMKilled, "OOMKilled"},
		{"Error with an exit code", 4, "Error", 1, true, eventpipev1.BlockerExitError, "Error (exit code 1)"},
		{"Init:Error", 3, "Error", 2, true, eventpipev1.BlockerExitError, "Error (exit code 2)"},
		{"the runtime could not start it", 4, "ContainerCannotRun", 128, true, eventpipev1.BlockerStartFailed, "ContainerCannotRun (exit code 128)"},
		{"StartError", 4, "StartError", 128, true, eventpipev1.BlockerStartFailed, "StartError (exit code 128)"},
		{"Completed with 0 blocks nothing", 4, "Completed", 0, true, "", ""},
		{"a past termination of a running container is history", 4, "Error", 1, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := seedWorld()
			p := seedPod()
			p.Phase = "Failed"
			for i := range p.Containers {
				p.Containers[i].WaitingReason, p.Containers[i].WaitingMessage = "", ""
			}
			c := &p.Containers[tt.container]
			c.TerminatedReason, c.TerminatedExitCode, c.Terminated = tt.reason, tt.code, tt.current
			m.addPod(p)
			e := mustNew(t, NewDefaultConfig(), m.lookups())
			out := e.DiagnosePod(p, t0)
			if tt.cause == "" {
				if len(out) != 0 {
					t.Fatalf("%d occurrences, want none: %+v", len(out), out[0].GetBlocker())
				}
				return
			}
			if len(out) != 1 {
				t.Fatalf("%d occurrences, want 1", len(out))
			}
			o, b := out[0], out[0].GetBlocker()
			if b.GetKind() != eventpipev1.BlockerKindContainer || b.GetCause() != tt.cause || b.GetDetail() != tt.detail ||
				b.GetContainer() != c.Name || o.GetContainer() != c.Name || b.GetSource() != eventpipev1.PullSourcePodStatus ||
				b.GetExitCode() != tt.code || !b.GetHasExitCode() || b.GetConfidence() != eventpipev1.ConfidenceCertain ||
				b.GetFix() == "" || o.GetReason() != tt.reason || o.GetSandbox().GetId() != seedID {
				t.Errorf("occurrence reason %q message %q blocker %+v", o.GetReason(), o.GetMessage(), b)
			}
		})
	}
}
