package kwire

import (
	"fmt"
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/eventpipe/eventpipe/enrich"
)

// testInterner is a map interner like the agent's; it counts calls.
type testInterner struct {
	m     map[string]string
	calls int
}

func (in *testInterner) intern(b []byte) string {
	in.calls++
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	s := string(b)
	in.m[s] = s
	return s
}

func optionSets() map[string]*MetaOptions {
	in := &testInterner{m: map[string]string{}}
	return map[string]*MetaOptions{
		"nil":      nil,
		"keep":     {KeepPrefixes: keepPrefix},
		"intern":   {KeepPrefixes: keepPrefix, Intern: in.intern},
		"keep-all": {KeepPrefixes: []string{""}, Intern: in.intern, InternSmall: func(b []byte) string { return string(b) }},
	}
}

func refOf(o *MetaOptions) refConv {
	c := refConv{podNameAnn: podNameAnn}
	if o != nil {
		c.keepPrefixes = o.KeepPrefixes
	}
	return c
}

func typedPod(t testing.TB, p *corev1.Pod, c refConv) (*enrich.Pod, bool) {
	t.Helper()
	var typed corev1.Pod
	if err := typed.Unmarshal(marshal(t, p)); err != nil {
		t.Fatal(err)
	}
	return c.pod(&typed)
}

func TestDecodePodEquivalence(t *testing.T) {
	fx := podFixtures()
	for oname, o := range optionSets() {
		for _, name := range sortedNames(fx) {
			want, wantWaiting := typedPod(t, fx[name], refOf(o))
			got, waiting, err := DecodePod(marshal(t, fx[name]), o)
			if err != nil {
				t.Fatalf("%s/%s: %v", oname, name, err)
			}
			if !reflect.DeepEqual(got, want) || waiting != wantWaiting {
				t.Errorf("%s/%s:\n got %+v waiting=%v\nwant %+v waiting=%v", oname, name, got, waiting, want, wantWaiting)
			}
		}
	}
}

// Spot checks of the fixtures' meaning, independent of the reference.
func TestDecodePodValues(t *testing.T) {
	fx := podFixtures()
	o := &MetaOptions{KeepPrefixes: keepPrefix}
	p, waiting, err := DecodePod(marshal(t, fx["workload"]), o)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range p.Containers {
		names = append(names, fmt.Sprintf("%s/%v/%s", c.Name, c.Init, c.WaitingReason))
	}
	want := []string{"openshell-sandbox-bootstrap/true/", "openshell-supervisor-install/true/", "openshell-network-init/true/",
		"workspace-init/true/ImagePullBackOff", "agent/false/PodInitializing", "openshell-supervisor-network/false/PodInitializing"}
	if !reflect.DeepEqual(names, want) || !waiting {
		t.Errorf("containers %v waiting %v", names, waiting)
	}
	if p.Containers[3].WaitingMessage != seedBackOff || p.Containers[0].TerminatedReason != "Completed" || p.NodeName != seedNode || p.Phase != "Pending" {
		t.Errorf("workload pod: %+v", p)
	}
	if len(p.Labels) != 3 || p.Labels.Get("app.kubernetes.io/name") != "" || len(p.Annotations) != 1 {
		t.Errorf("kept labels %v annotations %v", p.Labels, p.Annotations)
	}
	if len(p.Owners) != 1 || !p.Owners[0].Controller || p.Owners[0].Kind != "Sandbox" {
		t.Errorf("owners %+v", p.Owners)
	}
	p, _, err = DecodePod(marshal(t, fx["crashloop"]), o)
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Containers[0]; c.TerminatedReason != "OOMKilled" || c.TerminatedExitCode != 137 || c.RestartCount != 5 || c.WaitingReason != "CrashLoopBackOff" {
		t.Errorf("app: %+v", c)
	}
	if c := p.Containers[1]; c.TerminatedReason != "Error" || c.TerminatedExitCode != 1 {
		t.Errorf("sidecar: state wins over lastState: %+v", c)
	}
	if p, _, err := DecodePod(marshal(t, fx["exit-codes"]), o); err != nil {
		t.Fatal(err)
	} else if got := [3]int32{p.Containers[0].TerminatedExitCode, p.Containers[1].TerminatedExitCode, p.Containers[2].TerminatedExitCode}; got != [3]int32{-1073741510, 137, 255} {
		t.Errorf("exit codes %v", got)
	}
	if p.Labels != nil || p.Annotations != nil || len(p.Owners) != 2 || p.Owners[1].Controller {
		t.Errorf("crashloop meta %+v", p.Meta)
	}
	// Probed: a readiness or startup probe (not liveness); ready and
	// started from the status, started unset reading as false.
	if p, _, err := DecodePod(marshal(t, fx["probed"]), o); err != nil {
		t.Fatal(err)
	} else {
		var got []string
		for _, c := range p.Containers {
			got = append(got, fmt.Sprintf("%s probed=%v ready=%v started=%v", c.Name, c.Probed, c.Ready, c.Started))
		}
		want := []string{"proxy probed=true ready=true started=true", "web probed=true ready=true started=true",
			"slow probed=true ready=false started=false", "live probed=false ready=true started=false"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("probed pod:\n got %q\nwant %q", got, want)
		}
	}
	p, waiting, err = DecodePod(marshal(t, fx["waiting-no-reason"]), o)
	if err != nil || waiting || p.Containers[0].WaitingMessage != "no reason given" {
		t.Errorf("waiting without reason: %+v %v %v", p, waiting, err)
	}
	p, _, err = DecodePod(nil, nil)
	if err != nil || p.Containers == nil || len(p.Containers) != 0 {
		t.Errorf("empty pod: %#v %v", p, err)
	}
}

// Repeated strings go through Intern (shared copies across objects);
// label values and pull secret names through InternSmall; unique ones are plain copies.
func TestDecodePodInterns(t *testing.T) {
	in := &testInterner{m: map[string]string{}}
	var small int
	o := &MetaOptions{KeepPrefixes: keepPrefix, Intern: in.intern, InternSmall: func(b []byte) string { small++; return string(b) }}
	b := marshal(t, podFixtures()["workload"])
	p1, _, err := DecodePod(b, o)
	if err != nil {
		t.Fatal(err)
	}
	p2, _, err := DecodePod(b, o)
	if err != nil {
		t.Fatal(err)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	for i := range p1.Containers {
		if !same(p1.Containers[i].Name, p2.Containers[i].Name) || !same(p1.Containers[i].Image, p2.Containers[i].Image) {
			t.Errorf("container %d strings not shared", i)
		}
	}
	if !same(p1.Namespace, p2.Namespace) || !same(p1.NodeName, p2.NodeName) || !same(p1.Phase, p2.Phase) || !same(p1.Owners[0].Kind, p2.Owners[0].Kind) {
		t.Error("namespace/node/phase/owner kind not shared")
	}
	if same(p1.UID, p2.UID) || same(p1.Containers[3].WaitingMessage, p2.Containers[3].WaitingMessage) {
		t.Error("unique strings interned")
	}
	if len(p1.PullSecrets) != 2 || p1.PullSecrets[0] != "regcred" || p1.PullSecrets[1] != "mirror-cred" {
		t.Errorf("pull secret names %q, want regcred and mirror-cred (the empty name dropped)", p1.PullSecrets)
	}
	if small != 2*6 {
		t.Errorf("InternSmall called %d times, want 12 (4 kept values and 2 pull secret names per pod)", small)
	}
}

func TestDecodePVCAndNamespace(t *testing.T) {
	for oname, o := range optionSets() {
		c := refOf(o)
		for name, pvc := range pvcFixtures() {
			var typed corev1.PersistentVolumeClaim
			if err := typed.Unmarshal(marshal(t, pvc)); err != nil {
				t.Fatal(err)
			}
			want := &enrich.PVC{Meta: c.enrichMeta(&typed.ObjectMeta)}
			got, err := DecodePVC(marshal(t, pvc), o)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s/pvc %s: got %+v, %v\nwant %+v", oname, name, got, err, want)
			}
		}
		for name, ns := range namespaceFixtures() {
			var typed corev1.Namespace
			if err := typed.Unmarshal(marshal(t, ns)); err != nil {
				t.Fatal(err)
			}
			want := &enrich.Namespace{Meta: c.enrichMeta(&typed.ObjectMeta)}
			got, err := DecodeNamespace(marshal(t, ns), o)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s/namespace %s: got %+v, %v\nwant %+v", oname, name, got, err, want)
			}
		}
	}
	got, err := DecodeNamespace(marshal(t, namespaceFixtures()["managed"]), &MetaOptions{KeepPrefixes: keepPrefix})
	if err != nil || len(got.Labels) != 3 || got.Labels.Get("openshell.ai/sandbox-workspace") != "repro" || got.Name != seedNS {
		t.Errorf("managed namespace: %+v %v", got, err)
	}
}

// A PodList body as the API server sends it, item by item.
func TestPodList(t *testing.T) {
	fx := podFixtures()
	names := sortedNames(fx)
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "777"}}
	for _, n := range names {
		list.Items = append(list.Items, *fx[n])
	}
	_, kind, raw, err := Unwrap(encodeBody(t, list))
	if err != nil || kind != "PodList" {
		t.Fatalf("%q %v", kind, err)
	}
	o := &MetaOptions{KeepPrefixes: keepPrefix}
	i := 0
	lm, err := ListItems(raw, func(item []byte) error {
		got, _, err := DecodePod(item, o)
		if err != nil {
			return err
		}
		want, _ := typedPod(t, fx[names[i]], refOf(o))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v\nwant %+v", names[i], got, want)
		}
		i++
		return nil
	})
	if err != nil || lm.ResourceVersion != "777" || lm.Continue != "" || i != len(names) {
		t.Errorf("list: %+v %v %d", lm, err, i)
	}
}

// Malformed pods name the part being decoded.
func TestDecodePodErrors(t *testing.T) {
	b := marshal(t, podFixtures()["workload"])
	refused := 0
	for n := 0; n < len(b); n++ {
		if _, _, err := DecodePod(b[:n:n], nil); err != nil {
			refused++
		}
	}
	if refused == 0 {
		t.Error("no prefix of a pod refused")
	}
	// spec (field 2) holding a container (field 2) whose name (field 1) is a varint.
	bad := []byte{0x12, 0x04, 0x12, 0x02, 0x08, 0x01}
	_, _, err := DecodePod(bad, nil)
	if err == nil || err.Error() != "kwire: Pod.spec.containers[0]: field 1: wrong wire type 0" {
		t.Errorf("bad container name: %v", err)
	}
	// The third container's bytes run past the end of the spec.
	bad = []byte{0x12, 0x0a, 0x12, 0x00, 0x12, 0x00, 0x12, 0x04, 0x0a, 0x05, 'a', 'b'}
	_, _, err = DecodePod(bad, nil)
	if err == nil || err.Error() != "kwire: Pod.spec.containers[2]: truncated" {
		t.Errorf("truncated container: %v", err)
	}
}
