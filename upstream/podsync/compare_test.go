// Package podsync_test checks nodekit's podsync package against the kubelet's
// own code (k8s.io/kubernetes v1.37.2) wherever that code is exported: the
// container hash and restart back-off key, the container restart rules, the pod
// conditions, the event object references and reasons, and the reason words
// that become waiting reasons. Equal values mean a kubelet and nodekit read
// each other's containers and write the same status.
package podsync_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/events"
	"k8s.io/kubernetes/pkg/kubelet/images"
	"k8s.io/kubernetes/pkg/kubelet/kuberuntime"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/status"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

func containers() []corev1.Container {
	return []corev1.Container{
		{Name: "nginx", Image: "docker.io/library/nginx:1.27"},
		{Name: "main", Image: "registry.k8s.io/pause:3.10.2", Args: []string{"ignored"}},
		{Name: "a-very-long-container-name-with-dashes", Image: "127.0.0.1:5000/nodekit/busybox@sha256:" + fmt.Sprintf("%064x", 42)},
		{Name: "limited", Image: "busybox", Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
		}},
		{Name: "x", Image: ""},
	}
}

func TestContainerHashMatchesKubelet(t *testing.T) {
	for _, c := range containers() {
		want := strconv.FormatUint(kubecontainer.HashContainer(&c), 16)
		if got := podsync.ContainerHash(&c); got != want {
			t.Errorf("%s: ContainerHash = %s, kubelet's = %s", c.Name, got, want)
		}
	}
}

func TestBackoffKeyMatchesKubelet(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "0b7c7f9e-1d4c-4a57-9a3d-2f9d0c5e1a11"}}
	for _, c := range containers() {
		want := kuberuntime.GetBackoffKey(pod, &c)
		if got := podsync.ContainerBackoffKey(pod, &c); got != want {
			t.Errorf("%s: ContainerBackoffKey = %s, kubelet's = %s", c.Name, got, want)
		}
	}
}

func TestContainerShouldRestartMatchesKubelet(t *testing.T) {
	policies := []*corev1.ContainerRestartPolicy{nil, ptr.To(corev1.ContainerRestartPolicyAlways), ptr.To(corev1.ContainerRestartPolicyOnFailure), ptr.To(corev1.ContainerRestartPolicyNever)}
	rules := [][]corev1.ContainerRestartRule{
		nil,
		{{Action: corev1.ContainerRestartRuleActionRestart, ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42, 43}}}},
		{{Action: corev1.ContainerRestartRuleActionRestart, ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpNotIn, Values: []int32{0}}}},
		{{Action: corev1.ContainerRestartRuleActionRestartAllContainers, ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{1}}}},
	}
	n := 0
	for _, podPolicy := range []corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever} {
		for _, p := range policies {
			for _, r := range rules {
				for _, code := range []int32{0, 1, 42, 137} {
					c := corev1.Container{Name: "c", RestartPolicy: p, RestartPolicyRules: r}
					spec := corev1.PodSpec{RestartPolicy: podPolicy}
					want := podutil.ContainerShouldRestart(c, spec, code)
					if got := podsync.ContainerShouldRestart(&c, &spec, code); got != want {
						t.Errorf("pod %s, container %v, rules %v, exit %d: got %v, kubelet %v", podPolicy, p, r, code, got, want)
					}
					n++
				}
			}
		}
	}
	t.Logf("%d combinations compared", n)
}

func TestReasonWordsMatchKubelet(t *testing.T) {
	pairs := map[error]error{
		podsync.ErrCrashLoopBackOff:      kubecontainer.ErrCrashLoopBackOff,
		podsync.ErrRunContainer:          kubecontainer.ErrRunContainer,
		podsync.ErrKillContainer:         kubecontainer.ErrKillContainer,
		podsync.ErrCreatePodSandbox:      kubecontainer.ErrCreatePodSandbox,
		podsync.ErrConfigPodSandbox:      kubecontainer.ErrConfigPodSandbox,
		podsync.ErrKillPodSandbox:        kubecontainer.ErrKillPodSandbox,
		podsync.ErrImagePull:             images.ErrImagePull,
		podsync.ErrImagePullBackOff:      images.ErrImagePullBackOff,
		podsync.ErrImageNeverPull:        images.ErrImageNeverPull,
		podsync.ErrInvalidImageName:      images.ErrInvalidImageName,
		podsync.ErrCreateContainerConfig: kuberuntime.ErrCreateContainerConfig,
		podsync.ErrCreateContainer:       kuberuntime.ErrCreateContainer,
		podsync.ErrPostStartHook:         kuberuntime.ErrPostStartHook,
	}
	for ours, theirs := range pairs {
		if ours.Error() != theirs.Error() {
			t.Errorf("reason %q, kubelet's %q", ours, theirs)
		}
	}
	eventPairs := map[string]string{
		podsync.EventCreated: events.CreatedContainer, podsync.EventStarted: events.StartedContainer,
		podsync.EventFailed: events.FailedToCreateContainer, podsync.EventKilling: events.KillingContainer,
		podsync.EventBackOff: events.BackOffStartContainer, podsync.EventPulling: events.PullingImage,
		podsync.EventPulled: events.PulledImage, podsync.EventErrImageNeverPull: events.ErrImageNeverPullPolicy,
		podsync.EventInspectFailed: events.FailedToInspectImage, podsync.EventSandboxChanged: events.SandboxChanged,
		podsync.EventFailedCreatePodSandBox: events.FailedCreatePodSandBox, podsync.EventFailedPodSandBoxStatus: events.FailedStatusPodSandBox,
		podsync.EventFailedPostStartHook: events.FailedPostStartHook, podsync.EventFailedPreStopHook: events.FailedPreStopHook,
	}
	for ours, theirs := range eventPairs {
		if ours != theirs {
			t.Errorf("event reason %q, kubelet's %q", ours, theirs)
		}
	}
}

// refRecorder keeps the objects events were recorded against.
type refRecorder struct {
	mu   sync.Mutex
	refs []*corev1.ObjectReference
}

func (r *refRecorder) Eventf(obj runtime.Object, _, _, _ string, _ ...any) {
	if ref, ok := obj.(*corev1.ObjectReference); ok {
		r.mu.Lock()
		r.refs = append(r.refs, ref)
		r.mu.Unlock()
	}
}

func TestEventReferencesMatchKubelet(t *testing.T) {
	rt := podsynctest.New(nil)
	rt.AddImage("busybox:1.36")
	rec := &refRecorder{}
	s, err := podsync.New(podsync.Config{Runtime: rt, Builder: &podsynctest.Builder{}, Events: rec})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1", ResourceVersion: "42"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}},
			Containers:     []corev1.Container{{Name: "app", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	ctx := context.Background()
	s.SyncPod(ctx, pod, nil)
	_ = rt.Exit(rt.ContainerByName("init").Id, 0, "", "")
	s.SyncPod(ctx, pod, nil)
	seen := map[string]bool{}
	for _, ref := range rec.refs {
		var spec *corev1.Container
		for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
			if ref.FieldPath == "spec.initContainers{"+c.Name+"}" || ref.FieldPath == "spec.containers{"+c.Name+"}" {
				spec = &c
			}
		}
		if spec == nil {
			t.Fatalf("event about an unknown container: %+v", ref)
		}
		want, err := kubecontainer.GenerateContainerRef(pod, spec)
		if err != nil {
			t.Fatal(err)
		}
		if *ref != *want {
			t.Errorf("event reference %+v, kubelet's %+v", *ref, *want)
		}
		seen[spec.Name] = true
	}
	if !seen["init"] || !seen["app"] {
		t.Errorf("expected events about both containers, saw %v", seen)
	}
}

// TestConditionsMatchKubelet computes pod statuses with podsync and recomputes
// the four kubelet conditions with the kubelet's own generators from the same
// container statuses and phase.
func TestConditionsMatchKubelet(t *testing.T) {
	now := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	ready := func(id string, attempt uint32, state runtimeapi.PodSandboxState, ip string) *runtimeapi.PodSandboxStatus {
		return &runtimeapi.PodSandboxStatus{Id: id, State: state, CreatedAt: int64(attempt) + 1,
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "uid-1", Attempt: attempt},
			Network:  &runtimeapi.PodSandboxNetworkStatus{Ip: ip},
			Linux:    &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{}}}}
	}
	ctr := func(name, id string, state runtimeapi.ContainerState, exit int32, created int64) *runtimeapi.ContainerStatus {
		st := &runtimeapi.ContainerStatus{Id: id, State: state, ExitCode: exit, CreatedAt: created,
			Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: "busybox"},
			Labels: map[string]string{podsync.LabelContainerName: name}}
		if state != runtimeapi.ContainerState_CONTAINER_CREATED {
			st.StartedAt = created + 1
		}
		if state == runtimeapi.ContainerState_CONTAINER_EXITED {
			st.FinishedAt = created + 2
			st.Reason = "Completed"
			if exit != 0 {
				st.Reason = "Error"
			}
		}
		return st
	}
	const (
		running = runtimeapi.ContainerState_CONTAINER_RUNNING
		exited  = runtimeapi.ContainerState_CONTAINER_EXITED
		created = runtimeapi.ContainerState_CONTAINER_CREATED
	)
	sbReady := runtimeapi.PodSandboxState_SANDBOX_READY
	sbDead := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	always := corev1.ContainerRestartPolicyAlways

	base := func(policy corev1.RestartPolicy, inits ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1", Generation: 4},
			Spec: corev1.PodSpec{RestartPolicy: policy, InitContainers: inits,
				Containers:     []corev1.Container{{Name: "app", Image: "busybox"}, {Name: "side", Image: "busybox", ReadinessProbe: &corev1.Probe{}}},
				ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/gate"}}},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: "example.com/gate", Status: corev1.ConditionTrue}}},
		}
	}
	cases := []struct {
		name   string
		pod    *corev1.Pod
		view   *podsync.PodView
		probes map[string]podsync.ProbeResult
	}{
		{"new pod", base(corev1.RestartPolicyAlways), &podsync.PodView{}, nil},
		{"running, side not ready", base(corev1.RestartPolicyAlways), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbReady, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("app", "a", running, 0, 10), ctr("side", "s", running, 0, 9)}}, nil},
		{"running, all ready", base(corev1.RestartPolicyAlways), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbReady, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("app", "a", running, 0, 10), ctr("side", "s", running, 0, 9)}},
			map[string]podsync.ProbeResult{"containerd://s": podsync.ProbeSuccess}},
		{"init running", base(corev1.RestartPolicyAlways, corev1.Container{Name: "i1", Image: "busybox"}, corev1.Container{Name: "i2", Image: "busybox"}), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbReady, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("i1", "i", running, 0, 5)}}, nil},
		{"sidecar started, app created", base(corev1.RestartPolicyAlways, corev1.Container{Name: "proxy", Image: "busybox", RestartPolicy: &always}), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbReady, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("app", "a", created, 0, 10), ctr("proxy", "p", running, 0, 5)}}, nil},
		{"never, one failed", base(corev1.RestartPolicyNever), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbReady, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("app", "a", exited, 0, 10), ctr("side", "s", exited, 2, 9)}}, nil},
		{"onfailure, all succeeded", base(corev1.RestartPolicyOnFailure), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbDead, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("app", "a", exited, 0, 10), ctr("side", "s", exited, 0, 9)}}, nil},
		{"sandbox without IP", base(corev1.RestartPolicyAlways), &podsync.PodView{
			Sandboxes: []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbReady, "")}}, nil},
		{"two ready sandboxes", base(corev1.RestartPolicyAlways), &podsync.PodView{
			Sandboxes: []*runtimeapi.PodSandboxStatus{ready("sb2", 1, sbReady, "10.0.0.6"), ready("sb1", 0, sbReady, "10.0.0.5")}}, nil},
		{"init running again after the pod was initialized", func() *corev1.Pod {
			p := base(corev1.RestartPolicyAlways, corev1.Container{Name: "i1", Image: "busybox"})
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue})
			return p
		}(), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb2", 1, sbReady, "10.0.0.6")},
			Containers: []*runtimeapi.ContainerStatus{ctr("i1", "i", running, 0, 5)}}, nil},
		{"sandbox dead, sidecar waiting", base(corev1.RestartPolicyAlways, corev1.Container{Name: "proxy", Image: "busybox", RestartPolicy: &always}), &podsync.PodView{
			Sandboxes:  []*runtimeapi.PodSandboxStatus{ready("sb1", 0, sbDead, "10.0.0.5")},
			Containers: []*runtimeapi.ContainerStatus{ctr("proxy", "p", exited, 137, 5), ctr("app", "a", exited, 137, 6)}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			probes := podsync.ProbeResultsFunc(func(_ podsync.ProbeType, id string) (podsync.ProbeResult, bool) {
				r, ok := tc.probes[id]
				return r, ok
			})
			old := tc.pod.Status
			got := podsync.PodStatus(tc.pod, tc.view, podsync.StatusInput{Now: now, Probes: probes})
			all := append(append([]corev1.ContainerStatus{}, got.InitContainerStatuses...), got.ContainerStatuses...)
			conds := append([]corev1.PodCondition{}, old.Conditions...)
			kstatus := &kubecontainer.PodStatus{ID: "uid-1", SandboxStatuses: tc.view.Sandboxes}
			want := []corev1.PodCondition{
				status.GeneratePodReadyToStartContainersCondition(tc.pod, &old, kstatus),
				status.GeneratePodInitializedCondition(tc.pod, &old, all, got.Phase),
				status.GeneratePodReadyCondition(tc.pod, &old, conds, all, got.Phase),
				status.GenerateContainersReadyCondition(tc.pod, &old, all, got.Phase),
			}
			for _, w := range want {
				var g *corev1.PodCondition
				for i := range got.Conditions {
					if got.Conditions[i].Type == w.Type {
						g = &got.Conditions[i]
					}
				}
				if g == nil {
					t.Errorf("no %s condition", w.Type)
					continue
				}
				if g.Status != w.Status || g.Reason != w.Reason || g.Message != w.Message || g.ObservedGeneration != w.ObservedGeneration {
					t.Errorf("%s: got %s/%s/%q gen %d, kubelet %s/%s/%q gen %d", w.Type,
						g.Status, g.Reason, g.Message, g.ObservedGeneration, w.Status, w.Reason, w.Message, w.ObservedGeneration)
				}
			}
		})
	}
}

// captureDoer records requests and answers 204.
type captureDoer struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (d *captureDoer) Do(req *http.Request) (*http.Response, error) {
	d.mu.Lock()
	d.reqs = append(d.reqs, req)
	d.mu.Unlock()
	return &http.Response{StatusCode: http.StatusNoContent, Body: io.NopCloser(strings.NewReader(""))}, nil
}

// TestHTTPHookRequestsMatchKubelet runs httpGet lifecycle handlers through the
// kubelet's own handler runner and through a Syncer's postStart, and compares
// the requests they send.
func TestHTTPHookRequestsMatchKubelet(t *testing.T) {
	ctr := corev1.Container{Name: "app", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent,
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "https", ContainerPort: 8443}}}
	handlers := []*corev1.HTTPGetAction{
		{Host: "10.1.2.3", Port: intstr.FromInt32(80), Path: "/hook"},
		{Host: "10.1.2.3", Port: intstr.FromString("http"), Path: "started?x=1&y=2"},
		{Host: "10.1.2.3", Port: intstr.FromString("https"), Path: "/a%20b", Scheme: corev1.URISchemeHTTPS},
		{Host: "10.1.2.3", Port: intstr.FromString("9090"), Path: "/no-such-port"},
		{Host: "10.1.2.3", Port: intstr.FromInt32(70000), Path: "/bad-port"},
		{Host: "fd00::7", Port: intstr.FromInt32(80), HTTPHeaders: []corev1.HTTPHeader{
			{Name: "X-Hook", Value: "1"}, {Name: "X-Hook", Value: "2"}, {Name: "Host", Value: "svc.example"}, {Name: "Accept", Value: ""}}},
		{Host: "10.1.2.3", Port: intstr.FromInt32(80), HTTPHeaders: []corev1.HTTPHeader{{Name: "User-Agent", Value: "mine"}, {Name: "Accept", Value: "text/plain"}}},
	}
	for i, h := range handlers {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"},
				Spec: corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{ctr}}}
			pod.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{HTTPGet: h}}

			up := &captureDoer{}
			runner := lifecycle.NewHandlerRunner(up, nil, nil, nil)
			upMsg, upErr := runner.Run(context.Background(), kubecontainer.ContainerID{Type: "containerd", ID: "x"}, pod, &pod.Spec.Containers[0], pod.Spec.Containers[0].Lifecycle.PostStart)

			ours := &captureDoer{}
			rt := podsynctest.New(nil)
			rt.AddImage("busybox:1.36")
			s, err := podsync.New(podsync.Config{Runtime: rt, Builder: &podsynctest.Builder{}, HTTP: ours})
			if err != nil {
				t.Fatal(err)
			}
			res := s.SyncPod(context.Background(), pod, nil)
			if upErr != nil {
				// The hook fails in both; the container's waiting message is the kubelet's.
				if !errors.Is(res.Error(), podsync.ErrPostStartHook) {
					t.Fatalf("kubelet's hook failed (%v) but podsync's did not: %v", upErr, res.Error())
				}
				if got := podsync.Message(res.Steps[len(res.Steps)-1].Err); got != upMsg {
					t.Errorf("message %q, kubelet's %q", got, upMsg)
				}
				return
			}
			if err := res.Error(); err != nil {
				t.Fatal(err)
			}
			if len(up.reqs) != 1 || len(ours.reqs) != 1 {
				t.Fatalf("requests: kubelet %d, podsync %d", len(up.reqs), len(ours.reqs))
			}
			want, got := up.reqs[0], ours.reqs[0]
			// A test binary has no version stamp: upstream says "kube-lifecycle/.".
			if want.Header.Get("User-Agent") == "kube-lifecycle/." {
				want.Header.Set("User-Agent", podsync.HookUserAgent)
			}
			if got.Method != want.Method || got.URL.String() != want.URL.String() || got.Host != want.Host {
				t.Errorf("request %s %s (host %q), kubelet's %s %s (host %q)", got.Method, got.URL, got.Host, want.Method, want.URL, want.Host)
			}
			if fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
				t.Errorf("headers %v, kubelet's %v", got.Header, want.Header)
			}
		})
	}
}
