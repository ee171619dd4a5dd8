package probe_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/probe"
	"github.com/nodekit-dev/nodekit/probe/probetest"
)

type round struct {
	uid       types.UID
	container string
	typ       probe.Type
}

type harness struct {
	t        *testing.T
	clk      *testingclock.FakeClock
	m        *probe.Manager
	prober   *probetest.Prober
	statuses *probetest.Statuses
	metrics  *probetest.Metrics
	events   *probetest.Events
	rounds   chan round
	pending  []round
	cancel   context.CancelFunc
	done     chan error
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newHarness builds a manager on a fake clock. fresh keeps the manager "just
// started"; otherwise the clock moves an hour on so no first random delay applies.
func newHarness(t *testing.T, fresh bool, rnd func() float64) *harness {
	h := &harness{
		t:        t,
		clk:      testingclock.NewFakeClock(t0),
		prober:   &probetest.Prober{},
		statuses: &probetest.Statuses{},
		metrics:  &probetest.Metrics{},
		events:   &probetest.Events{},
		rounds:   make(chan round, 10000),
		done:     make(chan error, 1),
	}
	m, err := probe.NewManager(probe.Config{Status: h.statuses, Prober: h.prober, Clock: h.clk, Metrics: h.metrics, Events: h.events, UpdatesBuffer: 1000})
	require.NoError(t, err)
	m.SetTestHooks(rnd, func(uid types.UID, c string, typ probe.Type) { h.rounds <- round{uid, c, typ} })
	h.m = m
	if !fresh {
		h.clk.Step(time.Hour)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- m.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		assert.NoError(h.t, err)
	case <-time.After(5 * time.Second):
		h.t.Error("Run did not return")
	}
}

// next waits for one probe round of the given worker.
func (h *harness) next(c string, typ probe.Type) {
	h.t.Helper()
	for i, r := range h.pending {
		if r.container == c && r.typ == typ {
			h.pending = append(h.pending[:i], h.pending[i+1:]...)
			return
		}
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case r := <-h.rounds:
			if r.container == c && r.typ == typ {
				return
			}
			h.pending = append(h.pending, r)
		case <-timeout:
			h.t.Fatalf("no round of %s %s", c, typ)
		}
	}
}

// quiet asserts that no round happens for a short real time.
func (h *harness) quiet() {
	h.t.Helper()
	require.Empty(h.t, h.pending)
	select {
	case r := <-h.rounds:
		h.t.Fatalf("unexpected round %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
}

// tick moves the clock one period and waits for the worker's round.
func (h *harness) tick(period time.Duration, c string, typ probe.Type) {
	h.t.Helper()
	h.clk.Step(period)
	h.next(c, typ)
}

func (h *harness) calls(c string) int {
	n := 0
	for _, call := range h.prober.Recorded() {
		if call.Target.Container != nil && call.Target.Container.Name == c {
			n++
		}
	}
	return n
}

func (h *harness) result(typ probe.Type, id string) probe.Kind {
	k, ok := h.m.Result(typ, id)
	if !ok {
		return "<none>"
	}
	return k
}

func tcpProbe(mod func(*corev1.Probe)) *corev1.Probe {
	p := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(80)}}, PeriodSeconds: 10}
	if mod != nil {
		mod(p)
	}
	return p
}

func testPod(uid string, c ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + uid, Namespace: "ns", UID: types.UID(uid)},
		Spec:       corev1.PodSpec{Containers: c},
	}
}

func running(name, id string, startedAt time.Time, started bool) corev1.ContainerStatus {
	return corev1.ContainerStatus{
		Name: name, ContainerID: id, Started: &started,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(startedAt)}},
	}
}

func podStatus(cs ...corev1.ContainerStatus) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", ContainerStatuses: cs}
}

var (
	failure = probetest.Step{Result: probe.Result{Kind: probe.Failure, Message: "down"}}
	success = probetest.Step{Result: probe.Result{Kind: probe.Success}}
	warning = probetest.Step{Result: probe.Result{Kind: probe.Warning, Message: "redirect"}}
	errored = probetest.Step{Result: probe.Result{Kind: probe.Unknown}, Err: errors.New("boom")}
)

const period = 10 * time.Second

func TestManagerInitialResults(t *testing.T) {
	h := newHarness(t, false, nil)
	delay := func(p *corev1.Probe) { p.InitialDelaySeconds = 100 }
	c := corev1.Container{Name: "app", LivenessProbe: tcpProbe(delay), ReadinessProbe: tcpProbe(delay), StartupProbe: tcpProbe(delay)}
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), false)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	assert.Equal(t, 3, h.m.WorkerCount())
	h.next("app", probe.Liveness)
	h.next("app", probe.Readiness)
	h.next("app", probe.Startup)
	assert.Equal(t, probe.Success, h.result(probe.Liveness, "containerd://a"))
	assert.Equal(t, probe.Failure, h.result(probe.Readiness, "containerd://a"))
	assert.Equal(t, probe.Unknown, h.result(probe.Startup, "containerd://a"))
	assert.Equal(t, 0, h.calls("app"), "no probe during the initial delay")
	got := map[probe.Type]probe.Kind{}
	for range 3 {
		u := <-h.m.Updates()
		assert.Equal(t, types.UID("u1"), u.PodUID)
		assert.Equal(t, "containerd://a", u.ContainerID)
		got[u.Type] = u.Result
	}
	assert.Equal(t, map[probe.Type]probe.Kind{probe.Liveness: probe.Success, probe.Readiness: probe.Failure, probe.Startup: probe.Unknown}, got)
}

func TestManagerInitialDelayCountsFromStartedAt(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(func(p *corev1.Probe) { p.InitialDelaySeconds = 25 })}
	// Started 5 s ago: probing may start 20 s from now, at the third tick.
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now().Add(-5*time.Second), true)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	h.next("app", probe.Readiness) // elapsed 5 s
	h.tick(period, "app", probe.Readiness)
	assert.Equal(t, 0, h.calls("app"), "elapsed 15 s < 25 s")
	h.clk.Step(9 * time.Second)
	h.quiet()
	h.tick(time.Second, "app", probe.Readiness)
	assert.Equal(t, 1, h.calls("app"), "elapsed 25 s: probed once")
	h.tick(period, "app", probe.Readiness)
	assert.Equal(t, 2, h.calls("app"))
}

func TestManagerThresholds(t *testing.T) {
	cases := []struct {
		name    string
		typ     probe.Type
		mod     func(*corev1.Probe)
		steps   []probetest.Step
		results []probe.Kind // cached result after each probe
	}{
		{name: "readiness default thresholds", typ: probe.Readiness, steps: []probetest.Step{success, failure, failure, failure, success},
			results: []probe.Kind{probe.Success, probe.Success, probe.Success, probe.Failure, probe.Success}},
		{name: "readiness success threshold 2", typ: probe.Readiness, mod: func(p *corev1.Probe) { p.SuccessThreshold = 2 },
			steps:   []probetest.Step{success, failure, success, success},
			results: []probe.Kind{probe.Failure, probe.Failure, probe.Failure, probe.Success}},
		{name: "readiness failure threshold 1", typ: probe.Readiness, mod: func(p *corev1.Probe) { p.FailureThreshold = 1 },
			steps: []probetest.Step{success, failure, success}, results: []probe.Kind{probe.Success, probe.Failure, probe.Success}},
		{name: "warning counts as success", typ: probe.Readiness, steps: []probetest.Step{warning}, results: []probe.Kind{probe.Success}},
		{name: "unknown without error counts as failure", typ: probe.Readiness, mod: func(p *corev1.Probe) { p.FailureThreshold = 1 },
			steps: []probetest.Step{success, {Result: probe.Result{Kind: probe.Unknown}}}, results: []probe.Kind{probe.Success, probe.Failure}},
		{name: "errors are thrown away", typ: probe.Readiness, mod: func(p *corev1.Probe) { p.FailureThreshold = 1 },
			steps: []probetest.Step{success, errored, errored}, results: []probe.Kind{probe.Success, probe.Success, probe.Success}},
		{name: "errors do not break a failure run", typ: probe.Readiness, mod: func(p *corev1.Probe) { p.FailureThreshold = 2 },
			steps: []probetest.Step{success, failure, errored, failure}, results: []probe.Kind{probe.Success, probe.Success, probe.Success, probe.Failure}},
		{name: "liveness failure threshold 3", typ: probe.Liveness, steps: []probetest.Step{failure, failure, failure},
			results: []probe.Kind{probe.Success, probe.Success, probe.Failure}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, false, nil)
			c := corev1.Container{Name: "app"}
			if tc.typ == probe.Readiness {
				c.ReadinessProbe = tcpProbe(tc.mod)
			} else {
				c.LivenessProbe = tcpProbe(tc.mod)
			}
			h.prober.Script("app", tc.steps...)
			h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
			require.NoError(t, h.m.AddPod(testPod("u1", c)))
			for i, want := range tc.results {
				if i == 0 {
					h.next("app", tc.typ)
				} else {
					h.tick(period, "app", tc.typ)
				}
				assert.Equal(t, want, h.result(tc.typ, "containerd://a"), "after probe %d", i+1)
			}
			assert.Equal(t, len(tc.steps), h.calls("app"))
		})
	}
}

func TestManagerLivenessFailureHoldsUntilNewContainer(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", LivenessProbe: tcpProbe(func(p *corev1.Probe) { p.FailureThreshold = 1 })}
	h.prober.Script("app", failure)
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	h.next("app", probe.Liveness)
	assert.Equal(t, probe.Failure, h.result(probe.Liveness, "containerd://a"))
	for range 3 {
		h.tick(period, "app", probe.Liveness)
	}
	assert.Equal(t, 1, h.calls("app"), "on hold: no probes")
	// The container restarts under a new ID.
	h.statuses.Set("u1", podStatus(running("app", "containerd://b", h.clk.Now(), true)))
	h.tick(period, "app", probe.Liveness)
	assert.Equal(t, 2, h.calls("app"), "probing resumed")
	assert.Equal(t, probe.Success, h.result(probe.Liveness, "containerd://b"))
	_, ok := h.m.Result(probe.Liveness, "containerd://a")
	assert.False(t, ok, "the old container's result is dropped")
}

func TestManagerStartupGating(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", StartupProbe: tcpProbe(nil), LivenessProbe: tcpProbe(nil), ReadinessProbe: tcpProbe(nil)}
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), false)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	for _, typ := range []probe.Type{probe.Startup, probe.Readiness, probe.Liveness} {
		h.next("app", typ)
	}
	// Only the startup probe ran; it succeeded and now holds.
	assert.Len(t, h.prober.Recorded(), 1)
	assert.Equal(t, probe.Success, h.result(probe.Startup, "containerd://a"))
	assert.Equal(t, probe.Failure, h.result(probe.Readiness, "containerd://a"))
	// The agent reports the container started: liveness and readiness run, startup idles.
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
	h.clk.Step(period)
	for range 3 {
		select {
		case <-h.rounds:
		case <-time.After(5 * time.Second):
			t.Fatal("missing rounds")
		}
	}
	assert.Equal(t, 3, len(h.prober.Recorded()), "startup 1 + liveness 1 + readiness 1")
	assert.Equal(t, probe.Success, h.result(probe.Readiness, "containerd://a"))
}

func TestManagerStartupFailureHolds(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", StartupProbe: tcpProbe(func(p *corev1.Probe) { p.FailureThreshold = 2 })}
	h.prober.Script("app", failure, failure, failure)
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), false)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	h.next("app", probe.Startup)
	assert.Equal(t, probe.Unknown, h.result(probe.Startup, "containerd://a"))
	h.tick(period, "app", probe.Startup)
	assert.Equal(t, probe.Failure, h.result(probe.Startup, "containerd://a"))
	h.tick(period, "app", probe.Startup)
	assert.Equal(t, 2, h.calls("app"), "held after the startup failure")
}

func TestManagerFirstRandomDelay(t *testing.T) {
	t.Run("fresh manager waits a random part of the period", func(t *testing.T) {
		h := newHarness(t, true, func() float64 { return 0.5 })
		c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)}
		h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
		require.NoError(t, h.m.AddPod(testPod("u1", c)))
		require.Eventually(t, func() bool { return h.clk.Waiters() == 1 }, 5*time.Second, time.Millisecond)
		h.clk.Step(4900 * time.Millisecond)
		h.quiet()
		assert.Equal(t, 0, h.calls("app"))
		h.tick(100*time.Millisecond, "app", probe.Readiness)
		assert.Equal(t, 1, h.calls("app"))
	})
	t.Run("manager started more than a period ago probes at once", func(t *testing.T) {
		h := newHarness(t, true, func() float64 { return 0.5 })
		h.clk.Step(period)
		c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)}
		h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
		require.NoError(t, h.m.AddPod(testPod("u1", c)))
		h.next("app", probe.Readiness)
		assert.Equal(t, 1, h.calls("app"))
	})
}

func TestManagerContainerRunningBeforeManagerStarted(t *testing.T) {
	h := newHarness(t, true, func() float64 { return 0 })
	c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(func(p *corev1.Probe) { p.InitialDelaySeconds = 1000 })}
	// Started 11 s before the manager: an agent restart, so no initial Failure is cached.
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", t0.Add(-11*time.Second), true)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	require.Eventually(t, func() bool { return h.clk.Waiters() == 1 }, 5*time.Second, time.Millisecond)
	h.tick(0, "app", probe.Readiness)
	_, ok := h.m.Result(probe.Readiness, "containerd://a")
	assert.False(t, ok)
	// A container started 9 s before is treated as new.
	h.statuses.Set("u2", podStatus(running("app", "containerd://b", t0.Add(-9*time.Second), true)))
	require.NoError(t, h.m.AddPod(testPod("u2", c)))
	require.Eventually(t, func() bool { return h.clk.Waiters() == 2 }, 5*time.Second, time.Millisecond)
	h.tick(0, "app", probe.Readiness)
	assert.Equal(t, probe.Failure, h.result(probe.Readiness, "containerd://b"))
}

func TestManagerPodDeletion(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", LivenessProbe: tcpProbe(nil), ReadinessProbe: tcpProbe(nil)}
	h.prober.Default = func(*corev1.Probe, probe.Target) (probe.Result, error) {
		return probe.Result{Kind: probe.Failure}, nil
	}
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
	pod := testPod("u1", c)
	require.NoError(t, h.m.AddPod(pod))
	h.next("app", probe.Liveness)
	h.next("app", probe.Readiness)
	deleting := pod.DeepCopy()
	now := metav1.NewTime(h.clk.Now())
	deleting.DeletionTimestamp = &now
	require.NoError(t, h.m.AddPod(deleting))
	h.clk.Step(period)
	h.next("app", probe.Liveness)
	h.next("app", probe.Readiness)
	require.Eventually(t, func() bool { return h.m.WorkerCount() == 1 }, 5*time.Second, time.Millisecond, "liveness stopped")
	// The liveness worker set Success before it left, then removed its result.
	assert.Equal(t, 3, len(h.prober.Recorded()), "liveness did not probe after deletion")
	h.tick(period, "app", probe.Readiness)
	assert.Equal(t, 4, len(h.prober.Recorded()), "readiness keeps probing")
}

func TestManagerStopsOnTerminatedPodsAndContainers(t *testing.T) {
	cases := []struct {
		name      string
		restart   corev1.RestartPolicy
		status    corev1.PodStatus
		keepGoing bool
	}{
		{name: "pod succeeded", status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
		{name: "pod failed", status: corev1.PodStatus{Phase: corev1.PodFailed}},
		{name: "terminated, never restarted", restart: corev1.RestartPolicyNever, status: terminated(0)},
		{name: "exit 0, on-failure", restart: corev1.RestartPolicyOnFailure, status: terminated(0)},
		{name: "exit 1, on-failure", restart: corev1.RestartPolicyOnFailure, status: terminated(1), keepGoing: true},
		{name: "terminated, always", restart: corev1.RestartPolicyAlways, status: terminated(0), keepGoing: true},
		{name: "waiting", restart: corev1.RestartPolicyNever, keepGoing: true, status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "app", ContainerID: "containerd://a", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, false, nil)
			pod := testPod("u1", corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)})
			pod.Spec.RestartPolicy = tc.restart
			h.statuses.Set("u1", tc.status)
			require.NoError(t, h.m.AddPod(pod))
			h.next("app", probe.Readiness)
			if tc.keepGoing {
				h.tick(period, "app", probe.Readiness)
				assert.Equal(t, 1, h.m.WorkerCount())
				if len(tc.status.ContainerStatuses) > 0 {
					assert.Equal(t, probe.Failure, h.result(probe.Readiness, "containerd://a"), "not running counts as failure")
				}
			} else {
				require.Eventually(t, func() bool { return h.m.WorkerCount() == 0 }, 5*time.Second, time.Millisecond)
			}
			assert.Equal(t, 0, h.calls("app"))
		})
	}
}

func terminated(code int32) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "app", ContainerID: "containerd://a",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}},
	}}}
}

func TestManagerRemoveAndCleanup(t *testing.T) {
	h := newHarness(t, false, nil)
	for _, uid := range []string{"u1", "u2", "u3"} {
		h.statuses.Set(types.UID(uid), podStatus(running("app", "containerd://"+uid, h.clk.Now(), true)))
		require.NoError(t, h.m.AddPod(testPod(uid, corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil), LivenessProbe: tcpProbe(nil)})))
	}
	for range 6 {
		<-h.rounds
	}
	assert.Equal(t, 6, h.m.WorkerCount())
	h.m.StopLivenessAndStartup(testPod("u1"))
	require.Eventually(t, func() bool { return h.m.WorkerCount() == 5 }, 5*time.Second, time.Millisecond)
	h.m.RemovePod(testPod("u1"))
	require.Eventually(t, func() bool { return h.m.WorkerCount() == 4 }, 5*time.Second, time.Millisecond)
	_, ok := h.m.Result(probe.Readiness, "containerd://u1")
	assert.False(t, ok, "results removed with the worker")
	h.m.CleanupPods(map[types.UID]struct{}{"u2": {}})
	require.Eventually(t, func() bool { return h.m.WorkerCount() == 2 }, 5*time.Second, time.Millisecond)
	_, ok = h.m.Result(probe.Readiness, "containerd://u2")
	assert.True(t, ok)
	assert.Len(t, h.metrics.Gone(), 4, "metric series of ended workers deleted")
}

func TestManagerMetricsAndEvents(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)}
	h.prober.Script("app", success, failure, warning, errored)
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	h.next("app", probe.Readiness)
	for range 3 {
		h.tick(period, "app", probe.Readiness)
	}
	l := probe.MetricLabels{ProbeType: "Readiness", Container: "app", Pod: "pod-u1", Namespace: "ns", PodUID: "u1"}
	assert.Equal(t, 2, h.metrics.Count(l, probe.MetricResultSuccessful), "success and warning")
	assert.Equal(t, 1, h.metrics.Count(l, probe.MetricResultFailed))
	assert.Equal(t, 0, h.metrics.Count(l, probe.MetricResultUnknown), "errors are not counted")
	assert.Len(t, h.metrics.Durations(l), 2, "durations only for successful probes")
	var reasons []string
	for _, e := range h.events.Recorded() {
		assert.Equal(t, corev1.EventTypeWarning, e.Type)
		reasons = append(reasons, e.Reason+": "+e.Message)
	}
	assert.Equal(t, []string{
		"Unhealthy: Readiness probe failed: down",
		"ProbeWarning: Readiness probe warning: redirect",
		"Unhealthy: Readiness probe errored and resulted in unknown state: boom",
	}, reasons)
}

func TestManagerTargets(t *testing.T) {
	h := newHarness(t, false, nil)
	c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)}
	h.statuses.Set("u1", podStatus(running("app", "containerd://abc", h.clk.Now(), true)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	h.next("app", probe.Readiness)
	calls := h.prober.Recorded()
	require.Len(t, calls, 1)
	assert.Equal(t, "10.0.0.7", calls[0].Target.Host)
	assert.Equal(t, "abc", calls[0].Target.ContainerID)
	assert.Equal(t, int32(1), calls[0].Spec.TimeoutSeconds, "spec defaulted")
	assert.Equal(t, int32(3), calls[0].Spec.FailureThreshold)
}

func TestManagerAddPodValidation(t *testing.T) {
	h := newHarness(t, false, nil)
	bad := tcpProbe(func(p *corev1.Probe) { p.FailureThreshold = -1 })
	named := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("web")}}}
	err := h.m.AddPod(testPod("u1",
		corev1.Container{Name: "a", ReadinessProbe: bad, LivenessProbe: tcpProbe(nil)},
		corev1.Container{Name: "b", LivenessProbe: tcpProbe(func(p *corev1.Probe) { p.SuccessThreshold = 2 })},
		corev1.Container{Name: "c", ReadinessProbe: named},
		corev1.Container{Name: "d", ReadinessProbe: &corev1.Probe{}},
	))
	require.Error(t, err)
	assert.ErrorIs(t, err, probe.ErrInvalidProbe)
	assert.ErrorIs(t, err, probe.ErrUnknownPort)
	assert.ErrorIs(t, err, probe.ErrNoHandler)
	for _, s := range []string{`container "a" readiness`, `container "b" liveness`, `container "c"`, `container "d"`} {
		assert.Contains(t, err.Error(), s)
	}
	assert.Equal(t, 1, h.m.WorkerCount(), "only the valid probe got a worker")
	assert.ErrorIs(t, h.m.AddPod(nil), probe.ErrInvalidProbe)
	h.stop()
	assert.ErrorIs(t, h.m.AddPod(testPod("u2")), probe.ErrStopped)
}

func TestNewManagerConfig(t *testing.T) {
	_, err := probe.NewManager(probe.Config{})
	assert.ErrorIs(t, err, probe.ErrInvalidConfig)
	_, err = probe.NewManager(probe.Config{Status: &probetest.Statuses{}, UpdatesBuffer: -1})
	assert.ErrorIs(t, err, probe.ErrInvalidConfig)
}

func TestManagerSidecarInitContainer(t *testing.T) {
	h := newHarness(t, false, nil)
	always := corev1.ContainerRestartPolicyAlways
	pod := testPod("u1")
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "sidecar", RestartPolicy: &always, ReadinessProbe: tcpProbe(nil)},
		{Name: "init", ReadinessProbe: tcpProbe(nil)}, // not restartable: never probed
	}
	st := podStatus()
	st.InitContainerStatuses = []corev1.ContainerStatus{running("sidecar", "containerd://s", h.clk.Now(), true)}
	h.statuses.Set("u1", st)
	require.NoError(t, h.m.AddPod(pod))
	h.next("sidecar", probe.Readiness)
	assert.Equal(t, 1, h.m.WorkerCount())
	assert.Equal(t, probe.Success, h.result(probe.Readiness, "containerd://s"))
}

func TestManagerUpdatePodStatus(t *testing.T) {
	h := newHarness(t, false, nil)
	pod := testPod("u1",
		corev1.Container{Name: "ready", ReadinessProbe: tcpProbe(nil)},
		corev1.Container{Name: "notready", ReadinessProbe: tcpProbe(nil)},
		corev1.Container{Name: "plain"},
		corev1.Container{Name: "starting", StartupProbe: tcpProbe(nil)},
	)
	h.prober.Script("notready", failure)
	h.prober.Script("starting", failure)
	now := h.clk.Now()
	st := podStatus(running("ready", "containerd://r", now, true), running("notready", "containerd://n", now, true),
		running("plain", "containerd://p", now, false), running("starting", "containerd://s", now, false))
	h.statuses.Set("u1", st)
	require.NoError(t, h.m.AddPod(pod))
	for range 3 { // "plain" has no probe, so no worker
		<-h.rounds
	}
	for i := range st.ContainerStatuses {
		st.ContainerStatuses[i].Started = nil
	}
	h.m.UpdatePodStatus(pod, &st)
	got := map[string]string{}
	for _, cs := range st.ContainerStatuses {
		got[cs.Name] = fmt.Sprintf("started=%v ready=%v", *cs.Started, cs.Ready)
	}
	assert.Equal(t, map[string]string{
		"ready":    "started=true ready=true",
		"notready": "started=true ready=false",
		"plain":    "started=true ready=true",
		"starting": "started=false ready=false",
	}, got)
}

func TestManagerCoalescesTicksOnTheGrid(t *testing.T) {
	h := newHarness(t, false, nil)
	h.clk.Step(30 * time.Millisecond) // off the 100 ms grid
	c := corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)}
	h.statuses.Set("u1", podStatus(running("app", "containerd://a", h.clk.Now(), true)))
	require.NoError(t, h.m.AddPod(testPod("u1", c)))
	// The first probe is immediate, as upstream; then the worker waits for the grid.
	require.Eventually(t, func() bool { return h.calls("app") == 1 && h.clk.Waiters() == 1 }, 5*time.Second, time.Millisecond)
	h.clk.Step(69 * time.Millisecond)
	h.quiet()                    // the round is reported once the ticker runs
	h.clk.Step(time.Millisecond) // on the grid: the ticker starts now
	h.next("app", probe.Readiness)
	h.clk.Step(period - time.Millisecond)
	h.quiet()
	h.tick(time.Millisecond, "app", probe.Readiness)
	assert.Equal(t, 2, h.calls("app"))
	assert.Equal(t, int64(0), h.clk.Now().UnixNano()%int64(100*time.Millisecond), "ticks land on the grid")
}

func TestManagerUpdatePodStatusTriggersReadiness(t *testing.T) {
	h := newHarness(t, false, nil)
	pod := testPod("u1", corev1.Container{Name: "app", ReadinessProbe: tcpProbe(nil)})
	h.prober.Script("app", failure, failure)
	st := podStatus(running("app", "containerd://a", h.clk.Now(), true))
	h.statuses.Set("u1", st)
	require.NoError(t, h.m.AddPod(pod))
	h.next("app", probe.Readiness)
	require.Equal(t, 1, h.calls("app"))
	h.m.UpdatePodStatus(pod, &st)
	assert.False(t, st.ContainerStatuses[0].Ready)
	// Not ready yet: the readiness worker is asked to probe now, without a tick.
	h.next("app", probe.Readiness)
	assert.Equal(t, 2, h.calls("app"))
	// Periodic probing goes on from the manual run.
	h.clk.Step(period - time.Second)
	h.quiet()
	h.tick(time.Second, "app", probe.Readiness)
	assert.Equal(t, 3, h.calls("app"))
	h.m.UpdatePodStatus(pod, &st)
	assert.True(t, st.ContainerStatuses[0].Ready, "third probe succeeded (default answer)")
}
