//go:build !agentonly

package main

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify/registrytest"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
)

// TestDiagnoseVerify: a sandbox whose private image's tag does not exist.
// The kubelet's words cannot tell a missing tag from missing credentials
// (not_found_or_unauthorized, as the text rule decides). diagnose --verify
// asks the registry with the user's credentials as docker finds them
// (DOCKER_CONFIG's config.json) and upgrades the cause to not_found,
// verified, naming the tags that exist; without credentials the registry's
// 401 decides only not_found_or_unauthorized, marked likely.
func TestDiagnoseVerify(t *testing.T) {
	old := diagnoseNow
	diagnoseNow = func() time.Time { return fT0.Add(5 * time.Minute) }
	defer func() { diagnoseNow = old }()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	reg := registrytest.New(t)
	for _, tag := range []string{"1.0", "1.1"} {
		reg.Push(t, "private/app:"+tag, registrytest.ImageFor(t, "linux", "amd64"))
	}
	image := reg.Host + "/private/app:9.9.9"

	f := startFollowCollector(t, t.TempDir(), "127.0.0.1:0")
	defer f.stop(t)
	msg := `Failed to pull image "` + image + `": rpc error: code = NotFound desc = failed to pull and unpack image "` + image + `": failed to resolve reference "` + image + `": pull access denied, repository does not exist or may require authorization`
	o := fOcc(1, time.Second, "Warning", "Failed", "kubelet", "agent", msg)
	o.Image, o.ImageRole = image, eventpipev1.ImageRoleWorkload
	o.PullFailure = &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFoundOrUnauthorized, Image: image,
		Disposition: eventpipev1.DispositionRetrying, Attempts: 2, FirstSeen: timestamppb.New(fT0), LastSeen: o.OccurredAt,
		Detail: "pull access denied, repository does not exist or may require authorization", Source: eventpipev1.PullSourceEvent,
		DecidedBy: eventpipev1.DecidedByTextRule, Confidence: eventpipev1.ConfidenceLikely}
	f.ingest(t, 1, "100", o)
	conn := []string{"--collector", f.addr, "--insecure", "--token-file", f.token("repro")}

	dockerConfig := func(auths string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"auths":{`+auths+`}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("DOCKER_CONFIG", dir)
	}

	// With the user's credentials.
	dockerConfig(`"` + reg.Host + `":{"auth":"` + base64.StdEncoding.EncodeToString([]byte(registrytest.User+":"+registrytest.Password)) + `"}`)
	code, out, errs := runDiagnoseCmd(append(conn, "--verify", fSandboxID)...)
	if code != diagnoseBlocked {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{
		"workload image " + image + ": not_found [registry, certain]\n",
		"    runtime: pull access denied, repository does not exist or may require authorization\n",
		"    registry (verified, certain, asked with your registry credentials): tag_not_found: tag 9.9.9 does not exist in " + reg.Host + "/private/app; newest tags by version (of 2): 1.1, 1.0\n",
		"    fix: tag 9.9.9 does not exist in " + reg.Host + "/private/app: check the image the sandbox was created with (newest tags by version: 1.1, 1.0)\n",
		"persistent: retrying will not fix it",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	// -o json carries the answer.
	code, out, _ = runDiagnoseCmd(append(conn, "--verify", "-o", "json", fSandboxID)...)
	var d diagnosis.Diagnosis
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != diagnoseBlocked || len(d.Blockers) != 1 {
		t.Fatalf("json: exit %d, %v\n%s", code, err, out)
	}
	if v := d.Blockers[0].Verified; v == nil || v.Answer != "tag_not_found" || v.DecidedBy != eventpipev1.DecidedByRegistry || d.Blockers[0].Cause != eventpipev1.CategoryNotFound {
		t.Errorf("json blocker %+v verified %+v", d.Blockers[0], v)
	}

	// Without credentials: the registry's 401 says private or absent.
	dockerConfig("")
	code, out, _ = runDiagnoseCmd(append(conn, "--verify", fSandboxID)...)
	for _, want := range []string{"workload image " + image + ": not_found_or_unauthorized [registry, likely]\n",
		"    registry (verified, likely, asked anonymously): unauthorized: " + reg.Host + " refuses anonymous reads of private/app (401)"} {
		if code != diagnoseBlocked || !strings.Contains(out, want) {
			t.Errorf("exit %d, stdout lacks %q:\n%s", code, want, out)
		}
	}
	// Without --verify nothing is asked.
	before := reg.Calls.Load()
	if code, out, _ = runDiagnoseCmd(append(conn, fSandboxID)...); code != diagnoseBlocked || strings.Contains(out, "registry (") {
		t.Errorf("without --verify: exit %d\n%s", code, out)
	}
	if reg.Calls.Load() != before {
		t.Error("diagnose without --verify called the registry")
	}
	if code, _, errs = runDiagnoseCmd(append(conn, "--platform", "linux/arm64", fSandboxID)...); code != diagnoseBadUsage || !strings.Contains(errs, "pass --verify too") {
		t.Errorf("--platform alone: exit %d %s", code, errs)
	}
}
