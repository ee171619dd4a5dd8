package probe_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodekit-dev/nodekit/probe"
	"github.com/nodekit-dev/nodekit/probe/probetest"
)

// Probing a service that has nothing to do with Kubernetes: any HTTP server.
func ExampleProbe() {
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "ok from "+r.Header.Get("User-Agent"))
	}))
	defer svc.Close()
	u, _ := url.Parse(svc.URL)
	port, _ := strconv.Atoi(u.Port())

	for _, path := range []string{"/healthz", "/missing"} {
		spec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)},
		}}
		res, err := probe.Probe(context.Background(), spec, probe.Target{Host: u.Hostname()})
		fmt.Println(res.Kind, res.Message, err)
	}
	// Output:
	// success ok from kube-probe/1.37 <nil>
	// failure HTTP probe failed with statuscode: 404 <nil>
}

// An exec probe run on this host, with $(VAR) expansion from the container env.
func ExampleProber_Probe_exec() {
	p := probe.NewProber(probe.Options{Execer: probe.OSExecer{}})
	spec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
		Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo $(GREETING); exit 1"}},
	}}
	target := probe.Target{Container: &corev1.Container{Env: []corev1.EnvVar{{Name: "GREETING", Value: "unwell"}}}}
	res, err := p.Probe(context.Background(), spec, target)
	fmt.Printf("%s %q %v\n", res.Kind, res.Message, err)
	// Output:
	// failure "unwell\n" <nil>
}

// A manager fed by the agent's own pod cache, here a probetest fake.
func ExampleManager() {
	statuses := &probetest.Statuses{}
	m, err := probe.NewManager(probe.Config{
		Status: statuses,
		Prober: &probetest.Prober{}, // a real agent leaves this nil or passes probe.NewProber
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()

	started := true
	statuses.Set("uid-1", corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7",
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "web", ContainerID: "containerd://abc", Started: &started,
			// Just started. (A container that started well before the manager is
			// taken as having survived an agent restart and gets no initial result.)
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now())}},
		}}})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: types.UID("uid-1")},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web",
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(80)}}},
		}}}}
	if err := m.AddPod(pod); err != nil {
		panic(err)
	}
	for u := range m.Updates() {
		fmt.Println(u.Type, u.ContainerID, u.Result)
		if u.Result == probe.Success {
			break
		}
	}
	cancel()
	<-done
	// Output:
	// Readiness containerd://abc failure
	// Readiness containerd://abc success
}
