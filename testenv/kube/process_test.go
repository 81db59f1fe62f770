package kube_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/freeport"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// servePart: the test binary, run by the CRI as a process container,
// serves on 0.0.0.0:PORT the content of FILE to every connection, logs
// "serving" and exits 0 on SIGTERM.
const (
	servePart    = "serve-file"
	processImage = "example.com/eventpipe/serve-file:1"
)

func testBinary() string {
	p, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return p
}

func serveFile(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "serve-file PORT FILE")
		return 2
	}
	l, err := net.Listen("tcp", "0.0.0.0:"+args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("serving", args[1], "on", l.Addr())
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := os.ReadFile(args[1])
			if err != nil {
				b = []byte(err.Error())
			}
			_, _ = c.Write(b)
			c.Close()
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	fmt.Println("SIGTERM: bye")
	return 0
}

// TestHollowNodePortForward: a container a ProcessRule matches is a real
// process the CRI starts with the kubelet's mounts (a Secret volume, set
// up by the kubelet's own secret plugin, read at its container path), and
// `kubectl port-forward` reaches it through kube-apiserver, the kubelet's
// server and the CRI's streaming server; its network is its own (its port
// is not the host's), reached at the pod's IP (the kubelet's TCP readiness
// probe passes); `kubectl logs` reads its output from the log the CRI
// writes; deleting the pod ends the process with SIGTERM.
func TestHollowNodePortForward(t *testing.T) {
	n, cs := hollow(t)
	ctx := context.Background()
	ports, err := freeport.Ports(2)
	if err != nil {
		t.Fatal(err)
	}
	podPort, localPort := ports[0], ports[1]
	const secret = "pf-data"
	// A generated namespace name, so the test can run again on the same
	// cluster (-count=2).
	nsObj, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "process-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := nsObj.Name
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret},
		Data: map[string][]byte{"greeting": []byte("through the kubelet")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPod(t, cs, ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pf"}, Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr(int64(30)),
		Containers: []corev1.Container{{Name: "serve", Image: processImage,
			Args:  []string{servePart, strconv.Itoa(podPort), "/etc/eventpipe-pf/greeting"},
			Ports: []corev1.ContainerPort{{Name: "data", ContainerPort: int32(podPort)}},
			// The kubelet's prober dials the pod's IP: the CRI's proxy
			// carries it into the process's network namespace.
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("data")}},
				PeriodSeconds: 1},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/etc/eventpipe-pf", ReadOnly: true}}}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}},
	}})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, "pf", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if isReady(pod) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod not Ready: %+v\nkubelet log:\n%s", pod.Status, n.LogTail(6000))
		}
		time.Sleep(250 * time.Millisecond)
	}

	kubectl := filepath.Join(cluster.BinDir(), "kubectl") // kubeparts' kubectl (testenv/build)
	pf := exec.Command(kubectl, "--kubeconfig", cluster.Kubeconfig(), "-n", ns, "port-forward", "pod/pf",
		fmt.Sprintf("%d:%d", localPort, podPort))
	var pfOut bytes.Buffer
	pf.Stdout, pf.Stderr = &pfOut, &pfOut
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pf.Process.Kill(); _ = pf.Wait() }()
	var got string
	deadline = time.Now().Add(time.Minute)
	for {
		got, err = dialRead(fmt.Sprintf("127.0.0.1:%d", localPort))
		if err == nil && got != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("port-forward: %v (read %q)\nkubectl:\n%s\nkubelet log:\n%s", err, got, pfOut.String(), n.LogTail(4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if got != "through the kubelet" {
		t.Errorf("through the port-forward: %q, want the Secret's value", got)
	}

	logs, err := exec.Command(kubectl, "--kubeconfig", cluster.Kubeconfig(), "-n", ns, "logs", "pf").CombinedOutput()
	if err != nil || !strings.Contains(string(logs), "serving /etc/eventpipe-pf/greeting") {
		t.Errorf("kubectl logs: %v\n%s", err, logs)
	}

	// The process has a network of its own: its port is not the host's.
	if dialable(fmt.Sprintf("127.0.0.1:%d", podPort)) {
		t.Errorf("the pod's port %d answers on the host's 127.0.0.1", podPort)
	}
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "pf", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podAddr := fmt.Sprintf("%s:%d", pod.Status.PodIP, podPort)
	if got, err := dialRead(podAddr); err != nil || got != "through the kubelet" {
		t.Errorf("at the pod's address %s: %q %v", podAddr, got, err)
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "pf", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for dialable(podAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("the process still serves after its pod's deletion\nkubelet log:\n%s", n.LogTail(4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	logPath, _ := filepath.Glob(filepath.Join(n.Dir(), "pod-logs", ns+"_pf_*", "serve", "0.log"))
	if len(logPath) == 1 {
		b, _ := os.ReadFile(logPath[0])
		if !bytes.Contains(b, []byte("stdout F SIGTERM: bye")) {
			t.Errorf("the process did not end on SIGTERM; its log:\n%s", b)
		}
	}
}

func isReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

func dialRead(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(bufio.NewReader(c))
	return string(b), err
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
