package kwire

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

const protoCT = ContentTypeProtobuf

// apiClient is plain net/http to the API server, authenticated as the
// agent's service account (the same permissions the agent ships with).
type apiClient struct {
	t    *testing.T
	host string
	hc   *http.Client
}

func (c *apiClient) get(ctx context.Context, path, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.host+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	return c.hc.Do(req)
}

// body GETs path and returns the status code, content type and body.
func (c *apiClient) body(ctx context.Context, path, accept string) (int, string, []byte) {
	c.t.Helper()
	resp, err := c.get(ctx, path, accept)
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

// protoList GETs a protobuf list and checks its envelope kind.
func (c *apiClient) protoList(ctx context.Context, path, wantKind string) []byte {
	c.t.Helper()
	code, ct, b := c.body(ctx, path, protoCT)
	if code != 200 || !strings.HasPrefix(ct, protoCT) {
		c.t.Fatalf("GET %s: %d %s %.200q", path, code, ct, b)
	}
	av, kind, raw, err := Unwrap(b)
	if err != nil || kind != wantKind || av != "v1" {
		c.t.Fatalf("GET %s: Unwrap %q %q %v", path, av, kind, err)
	}
	return raw
}

// Against a real kube-apiserver: objects created with the admin clientset,
// read back with plain HTTP in protobuf (core types) and JSON (the CR), and
// decoded by kwire; the same bytes decoded by the typed path must agree.
func TestAgainstAPIServer(t *testing.T) {
	cluster := kube.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(cluster.AdminConfig())
	dyn := dynamic.NewForConfigOrDie(cluster.AdminConfig())
	agentCfg := cluster.AgentConfig()
	hc, err := rest.HTTPClientFor(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.CloseIdleConnections()
	api := &apiClient{t: t, host: strings.TrimSuffix(agentCfg.Host, "/"), hc: hc}
	// Reads the agent is not allowed (single objects: its ClusterRole grants
	// list and watch only) go through the admin.
	adminHC, err := rest.HTTPClientFor(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer adminHC.CloseIdleConnections()
	adminAPI := &apiClient{t: t, host: api.host, hc: adminHC}
	o := &MetaOptions{KeepPrefixes: keepPrefix}
	ref := refOf(o)

	// One managed-mode sandbox (newer generation) and its objects.
	sb := scenario.NewSandbox("img-missing", "repro", scenario.ModeManaged)
	sb.Image = seedImage
	ns := sb.Namespace()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, sb.NamespaceObject(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	cr, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, sb.CR(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cr.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False", "reason": "DependenciesNotReady",
		"message": `Pod exists with phase: Pending; init container "workspace-init" is waiting: ImagePullBackOff`, "lastTransitionTime": "2026-10-29T10:10:40Z"}}}
	if _, err := dyn.Resource(gvr).Namespace(ns).UpdateStatus(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, sb.WorkloadPod(string(cr.GetUID())), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodPending
	for _, c := range pod.Spec.InitContainers {
		st := completedStatus(c.Name, c.Image)
		if c.Name == scenario.ContainerWorkspaceInit {
			st = waitingStatus(c.Name, c.Image, "ImagePullBackOff", seedBackOff, 0)
		}
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, st)
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{waitingStatus(scenario.ContainerAgent, sb.Image, "PodInitializing", "", 0)}
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, sb.SupervisorPod(string(cr.GetUID())), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, sb.PVC(string(cr.GetUID())), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Events: kubelet's (core/v1) and the controller's (events.k8s.io, with a series).
	for i, e := range []*corev1.Event{
		kubeletEvent("", sb.PodName(), "spec.initContainers{workspace-init}", "Normal", "Pulling", `Pulling image "`+seedImage+`"`, 1),
		kubeletEvent("", sb.PodName(), "spec.initContainers{workspace-init}", "Warning", "Failed", seedFailed, 3),
		kubeletEvent("", sb.PodName(), "spec.initContainers{workspace-init}", "Normal", "BackOff", seedBackOff, 12),
		kubeletEvent("", sb.PodName(), "spec.containers{agent}", "Warning", "Failed", "bad \xff\xfe bytes and ünïcode", 1),
	} {
		e.Name = fmt.Sprintf("%s.18a2f0c1a%d", sb.PodName(), i)
		e.UID, e.ResourceVersion, e.ManagedFields = "", "", nil
		e.Namespace, e.InvolvedObject.Namespace, e.InvolvedObject.UID = ns, ns, pod.UID
		if _, err := admin.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	now := metav1.NewMicroTime(time.Now())
	if _, err := admin.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", cr.GetName(), time.Now().UnixNano())},
		EventTime:  now, Series: &eventsv1.EventSeries{Count: 4, LastObservedTime: now},
		ReportingController: "agents.x-k8s.io/sandbox-controller", ReportingInstance: "agent-sandbox-controller-0",
		Action: "Reconcile", Reason: "DependenciesNotReady", Type: "Warning", Note: "Pod exists with phase: Pending",
		Regarding: corev1.ObjectReference{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Namespace: ns, Name: cr.GetName(), UID: cr.GetUID()},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var eventsRV string
	t.Run("lists", func(t *testing.T) {
		raw := api.protoList(ctx, "/api/v1/namespaces/"+ns+"/events", "EventList")
		var typed corev1.EventList
		if err := typed.Unmarshal(raw); err != nil {
			t.Fatal(err)
		}
		i := 0
		lm, err := ListItems(raw, func(item []byte) error {
			var got Event
			if err := DecodeEvent(item, &got); err != nil {
				return err
			}
			sameEvent(t, typed.Items[i].Name, &got, refEvent(&typed.Items[i]))
			i++
			return nil
		})
		if err != nil || i != 5 || lm.ResourceVersion != typed.ResourceVersion || lm.ResourceVersion == "" {
			t.Fatalf("events list: %d items, %+v, %v", i, lm, err)
		}
		eventsRV = lm.ResourceVersion
		var sawSeries bool
		for k := range typed.Items {
			if typed.Items[k].Series != nil && typed.Items[k].Series.Count == 4 && !typed.Items[k].EventTime.IsZero() {
				sawSeries = true
			}
		}
		if !sawSeries {
			t.Error("the events.k8s.io Event did not come back with its series and eventTime")
		}

		raw = api.protoList(ctx, "/api/v1/namespaces/"+ns+"/pods", "PodList")
		var pods corev1.PodList
		if err := pods.Unmarshal(raw); err != nil {
			t.Fatal(err)
		}
		i = 0
		var waitingPods int
		if _, err := ListItems(raw, func(item []byte) error {
			got, waiting, err := DecodePod(item, o)
			if err != nil {
				return err
			}
			want, wantWaiting := ref.pod(&pods.Items[i])
			if !reflect.DeepEqual(got, want) || waiting != wantWaiting {
				t.Errorf("pod %s:\n got %+v\nwant %+v", pods.Items[i].Name, got, want)
			}
			if waiting {
				waitingPods++
			}
			i++
			return nil
		}); err != nil || i != 2 || waitingPods != 1 {
			t.Fatalf("pods: %d items, %d waiting, %v", i, waitingPods, err)
		}

		raw = api.protoList(ctx, "/api/v1/namespaces/"+ns+"/persistentvolumeclaims", "PersistentVolumeClaimList")
		var pvcs corev1.PersistentVolumeClaimList
		if err := pvcs.Unmarshal(raw); err != nil {
			t.Fatal(err)
		}
		i = 0
		if _, err := ListItems(raw, func(item []byte) error {
			got, err := DecodePVC(item, o)
			if err != nil {
				return err
			}
			if want := ref.enrichMeta(&pvcs.Items[i].ObjectMeta); !reflect.DeepEqual(got.Meta, want) || len(got.Owners) != 1 {
				t.Errorf("pvc:\n got %+v\nwant %+v", got.Meta, want)
			}
			i++
			return nil
		}); err != nil || i != 1 {
			t.Fatalf("pvcs: %d, %v", i, err)
		}

		raw = api.protoList(ctx, "/api/v1/namespaces?limit=2", "NamespaceList")
		var nss corev1.NamespaceList
		if err := nss.Unmarshal(raw); err != nil {
			t.Fatal(err)
		}
		i = 0
		lm, err = ListItems(raw, func(item []byte) error {
			got, err := DecodeNamespace(item, o)
			if err != nil {
				return err
			}
			if want := ref.enrichMeta(&nss.Items[i].ObjectMeta); !reflect.DeepEqual(got.Meta, want) {
				t.Errorf("namespace:\n got %+v\nwant %+v", got.Meta, want)
			}
			i++
			return nil
		})
		if err != nil || i != 2 || lm.Continue == "" || lm.Continue != nss.Continue {
			t.Fatalf("namespaces page: %d items, %+v, %v", i, lm, err)
		}
		// A single object: the agent never GETs one (its ClusterRole grants
		// list and watch only), so this read is the admin's.
		raw = adminAPI.protoList(ctx, "/api/v1/namespaces/"+ns, "Namespace")
		got, err := DecodeNamespace(raw, o)
		if err != nil || got.Labels.Get("openshell.ai/sandbox-workspace") != "repro" || got.Name != ns {
			t.Errorf("managed namespace: %+v %v", got, err)
		}

		// The CR in JSON, list and discovery.
		code, _, b := api.body(ctx, "/apis/agents.x-k8s.io/v1beta1/namespaces/"+ns+"/sandboxes", "application/json")
		if code != 200 {
			t.Fatalf("sandboxes: %d %s", code, b)
		}
		i = 0
		if _, err := ListItemsJSON(b, func(item []byte) error {
			var u unstructured.Unstructured
			if err := u.UnmarshalJSON(item); err != nil {
				return err
			}
			got, err := DecodeSandboxJSON(item, o, podNameAnn)
			if err != nil {
				return err
			}
			if want := ref.sandbox(&u); !reflect.DeepEqual(got, want) || len(got.Conditions) != 1 {
				t.Errorf("sandbox:\n got %+v\nwant %+v", got, want)
			}
			i++
			return nil
		}); err != nil || i != 1 {
			t.Fatalf("sandboxes: %d %v", i, err)
		}
		code, _, b = api.body(ctx, "/apis/agents.x-k8s.io/v1beta1", "application/json")
		names, err := DecodeAPIResourceNamesJSON(b)
		if code != 200 || err != nil || !contains(names, "sandboxes") {
			t.Errorf("discovery: %d %v %v", code, names, err)
		}
	})

	t.Run("watch", func(t *testing.T) {
		if eventsRV == "" {
			t.Fatal("the lists subtest recorded no resourceVersion to watch from (it failed above)")
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		resp, err := api.get(wctx, "/api/v1/namespaces/"+ns+"/events?watch=1&allowWatchBookmarks=true&timeoutSeconds=20&resourceVersion="+eventsRV, protoCT)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("watch: %d", resp.StatusCode)
		}
		t.Logf("watch Content-Type: %s", resp.Header.Get("Content-Type"))
		e := kubeletEvent("", sb.PodName(), "spec.containers{agent}", "Warning", "Failed", seedErrPull, 1)
		e.Name, e.Namespace, e.UID, e.ResourceVersion, e.ManagedFields = "watched.1", ns, "", "", nil
		created, err := admin.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(resp.Body)
		frame, err := ReadFrame(r, nil, 16<<20)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("first frame starts with the magic: %v", bytes.HasPrefix(frame, []byte(magic)))
		var we metav1.WatchEvent
		if err := we.Unmarshal(frame); err != nil {
			t.Errorf("the frame is not a raw WatchEvent: %v", err)
		}
		typ, obj, err := DecodeWatchEvent(frame)
		if err != nil {
			t.Fatal(err)
		}
		var got Event
		if err := DecodeEvent(obj, &got); err != nil {
			t.Fatal(err)
		}
		var typed corev1.Event
		if err := typed.Unmarshal(obj); err != nil {
			t.Fatal(err)
		}
		if typ != "ADDED" || got.UID != string(created.UID) || got.ResourceVersion != created.ResourceVersion || got.Message != seedErrPull {
			t.Errorf("watched: %s %+v", typ, got.Event)
		}
		sameEvent(t, "watched", &got, refEvent(&typed))
	})

	t.Run("watchlist", func(t *testing.T) {
		// Pods are served from the watch cache: the initial events, then the
		// bookmark that ends them.
		var ev Event
		for _, tc := range []struct {
			path, accept string
			decode       func([]byte) error
		}{
			{"/api/v1/namespaces/" + ns + "/pods", protoCT, func(b []byte) error {
				p, _, err := DecodePod(b, o)
				if err == nil && (p.Namespace != ns || len(p.Containers) == 0) {
					err = fmt.Errorf("pod %+v", p)
				}
				return err
			}},
			{"/apis/agents.x-k8s.io/v1beta1/namespaces/" + ns + "/sandboxes", "application/json", func(b []byte) error {
				s, err := DecodeSandboxJSON(b, o, podNameAnn)
				if err == nil && (s.UID != string(cr.GetUID()) || len(s.Conditions) != 1 || s.Labels.Get("openshell.ai/sandbox-id") != sb.ID) {
					err = fmt.Errorf("sandbox %+v", s)
				}
				return err
			}},
			{"/api/v1/namespaces/" + ns + "/events", protoCT, func(b []byte) error {
				err := DecodeEvent(b, &ev)
				if err == nil && (ev.Namespace != ns || ev.Reason == "") {
					err = fmt.Errorf("event %+v", ev.Event)
				}
				return err
			}},
		} {
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			resp, err := api.get(wctx, tc.path+"?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=20", tc.accept)
			if err != nil {
				wcancel()
				t.Fatal(err)
			}
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				wcancel()
				s, err := decodeErrorBody(resp.Header.Get("Content-Type"), b)
				t.Errorf("%s: watch-list refused: %d %+v %v", tc.path, resp.StatusCode, s, err)
				continue
			}
			added, rv, end, err := readUntilInitialEnd(resp.Body, tc.accept == protoCT, tc.decode)
			resp.Body.Close()
			wcancel()
			if err != nil || !end || rv == "" || added == 0 {
				t.Errorf("%s: %d initial events, bookmark rv %q end %v, %v", tc.path, added, rv, end, err)
			} else {
				t.Logf("%s: %d initial events, then the initial-events-end bookmark at %s", tc.path, added, rv)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		// 404 in both encodings (as the admin: the agent may not GET).
		code, ct, b := adminAPI.body(ctx, "/api/v1/namespaces/"+ns+"/pods/nope", protoCT)
		s, err := decodeErrorBody(ct, b)
		if code != 404 || err != nil || s.Code != 404 || s.Reason != "NotFound" || !strings.Contains(s.Message, `"nope" not found`) {
			t.Errorf("404 protobuf: %d %s %+v %v", code, ct, s, err)
		}
		if !strings.HasPrefix(ct, protoCT) {
			t.Errorf("404 for a protobuf request came as %s", ct)
		}
		code, ct, b = adminAPI.body(ctx, "/apis/agents.x-k8s.io/v1beta1/namespaces/"+ns+"/sandboxes/nope", "application/json")
		s, err = decodeErrorBody(ct, b)
		if code != 404 || err != nil || s.Code != 404 || s.Reason != "NotFound" {
			t.Errorf("404 JSON: %d %s %+v %v", code, ct, s, err)
		}
		// 410: a watch of Events from a compacted resourceVersion.
		if _, err := cluster.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		resp, err := api.get(wctx, "/api/v1/namespaces/"+ns+"/events?watch=1&resourceVersion=1", protoCT)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			s, err = decodeErrorBody(resp.Header.Get("Content-Type"), b)
			t.Logf("410 as a response: %d", resp.StatusCode)
		} else {
			var frame []byte
			frame, err = ReadFrame(bufio.NewReader(resp.Body), nil, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			var typ string
			var obj []byte
			typ, obj, err = DecodeWatchEvent(frame)
			if err != nil || typ != "ERROR" {
				t.Fatalf("first watch event: %s %v", typ, err)
			}
			s, err = DecodeStatus(obj)
			t.Logf("410 as an ERROR watch event")
		}
		if err != nil || s.Code != 410 || !s.Expired() {
			t.Errorf("410: %+v %v", s, err)
		}
		// A protobuf watch-list with a bad parameter: 400/422 with causes.
		code, ct, b = api.body(ctx, "/api/v1/namespaces/"+ns+"/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=Exact", protoCT)
		s, err = decodeErrorBody(ct, b)
		if code < 400 || err != nil || s.Code != int32(code) || s.Message == "" {
			t.Errorf("bad watch-list: %d %+v %v", code, s, err)
		} else {
			t.Logf("bad watch-list: %d %s %+v", code, s.Reason, s.Causes)
		}
	})
}

func contains(ss []string, s string) bool {
	for _, v := range ss {
		if v == s {
			return true
		}
	}
	return false
}

// decodeErrorBody decodes a Status by Content-Type, as the agent will.
func decodeErrorBody(ct string, b []byte) (*Status, error) {
	if strings.HasPrefix(ct, protoCT) {
		_, kind, raw, err := Unwrap(b)
		if err != nil {
			return nil, err
		}
		if kind != "Status" {
			return nil, fmt.Errorf("body of kind %q", kind)
		}
		return DecodeStatus(raw)
	}
	return DecodeStatusJSON(b)
}

// readUntilInitialEnd reads a watch-list stream until the bookmark that
// ends the initial events.
func readUntilInitialEnd(body io.Reader, proto bool, decode func([]byte) error) (added int, rv string, end bool, err error) {
	next, bookmark := jsonStream(body)
	if proto {
		next, bookmark = protoStream(body)
	}
	for {
		typ, obj, err := next()
		if err != nil {
			return added, "", false, err
		}
		switch typ {
		case "ADDED":
			if err := decode(obj); err != nil {
				return added, "", false, err
			}
			added++
		case "BOOKMARK":
			rv, end, err := bookmark(obj)
			if err != nil || end {
				return added, rv, end, err
			}
		default:
			return added, "", false, fmt.Errorf("unexpected %s", typ)
		}
	}
}

type (
	nextFunc     func() (typ string, obj []byte, err error)
	bookmarkFunc func([]byte) (rv string, end bool, err error)
)

func protoStream(body io.Reader) (nextFunc, bookmarkFunc) {
	r := bufio.NewReader(body)
	var buf []byte
	return func() (string, []byte, error) {
		frame, err := ReadFrame(r, buf, 16<<20)
		if err != nil {
			return "", nil, err
		}
		buf = frame
		return DecodeWatchEvent(frame)
	}, BookmarkInfo
}

func jsonStream(body io.Reader) (nextFunc, bookmarkFunc) {
	dec := json.NewDecoder(body)
	return func() (string, []byte, error) {
		var msg json.RawMessage
		if err := dec.Decode(&msg); err != nil {
			return "", nil, err
		}
		return DecodeWatchEventJSON(msg)
	}, BookmarkInfoJSON
}
