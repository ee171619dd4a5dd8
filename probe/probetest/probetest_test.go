package probetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/probe"
	"github.com/nodekit-dev/nodekit/probe/probetest"
)

var (
	_ probe.Runner            = (*probetest.Prober)(nil)
	_ probe.Execer            = (*probetest.Execer)(nil)
	_ probe.PodStatusProvider = (*probetest.Statuses)(nil)
	_ probe.Metrics           = (*probetest.Metrics)(nil)
	_ probe.EventRecorder     = (*probetest.Events)(nil)
)

func target(container string) probe.Target {
	return probe.Target{Host: "10.0.0.1", Container: &corev1.Container{Name: container}}
}

func TestProberScriptThenDefault(t *testing.T) {
	ctx := context.Background()
	spec := &corev1.Probe{}
	errBoom := errors.New("boom")
	var p probetest.Prober
	p.Script("app", probetest.Step{Result: probe.Result{Kind: probe.Failure, Message: "first"}},
		probetest.Step{Result: probe.Result{Kind: probe.Unknown}, Err: errBoom})

	r, err := p.Probe(ctx, spec, target("app"))
	require.NoError(t, err)
	assert.Equal(t, probe.Result{Kind: probe.Failure, Message: "first"}, r)
	_, err = p.Probe(ctx, spec, target("app"))
	assert.ErrorIs(t, err, errBoom)

	// The queue is used up: no Default answers Success.
	r, err = p.Probe(ctx, spec, target("app"))
	require.NoError(t, err)
	assert.Equal(t, probe.Success, r.Kind)

	// Another container has its own (empty) queue; Default answers it.
	p.Default = func(_ *corev1.Probe, tg probe.Target) (probe.Result, error) {
		return probe.Result{Kind: probe.Warning, Message: tg.Container.Name}, nil
	}
	r, err = p.Probe(ctx, spec, target("side"))
	require.NoError(t, err)
	assert.Equal(t, probe.Result{Kind: probe.Warning, Message: "side"}, r)

	// A target without a container uses the "" queue.
	p.Script("", probetest.Step{Result: probe.Result{Kind: probe.Failure}})
	r, _ = p.Probe(ctx, spec, probe.Target{Host: "h"})
	assert.Equal(t, probe.Failure, r.Kind)

	calls := p.Recorded()
	require.Len(t, calls, 5)
	assert.Equal(t, "side", calls[3].Target.Container.Name)
	assert.Same(t, spec, calls[0].Spec)
	calls[0].Target.Host = "changed"
	assert.Equal(t, "10.0.0.1", p.Recorded()[0].Target.Host, "Recorded returns a copy")
}

func TestProberCallsChannel(t *testing.T) {
	p := probetest.Prober{Calls: make(chan probetest.Call)}
	done := make(chan probe.Result)
	go func() {
		r, _ := p.Probe(context.Background(), &corev1.Probe{}, target("app"))
		done <- r
	}()
	c := <-p.Calls
	assert.Equal(t, "app", c.Target.Container.Name)
	assert.Equal(t, probe.Success, (<-done).Kind)

	// A cancelled context ends a send nobody receives.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := p.Probe(ctx, &corev1.Probe{}, target("app"))
	require.NoError(t, err)
	assert.Equal(t, probe.Success, r.Kind)
}

func TestExecer(t *testing.T) {
	ctx := context.Background()
	var e probetest.Execer
	cmd := []string{"cat", "/ready"}
	out, errOut, code, err := e.ExecSync(ctx, "c1", cmd, time.Second)
	require.NoError(t, err)
	assert.Zero(t, code)
	assert.Empty(t, out)
	assert.Empty(t, errOut)

	e.Func = func(_ context.Context, id string, cmd []string, _ time.Duration) ([]byte, []byte, int, error) {
		return []byte(id), []byte(cmd[0]), 3, nil
	}
	out, errOut, code, err = e.ExecSync(ctx, "c2", []string{"false"}, 2*time.Second)
	require.NoError(t, err)
	assert.Equal(t, 3, code)
	assert.Equal(t, "c2", string(out))
	assert.Equal(t, "false", string(errOut))

	cmd[0] = "changed"
	assert.Equal(t, []probetest.ExecCall{
		{ContainerID: "c1", Cmd: []string{"cat", "/ready"}, Timeout: time.Second},
		{ContainerID: "c2", Cmd: []string{"false"}, Timeout: 2 * time.Second},
	}, e.Commands(), "commands are copied when recorded")
}

func TestExecerThroughProber(t *testing.T) {
	e := &probetest.Execer{Func: func(context.Context, string, []string, time.Duration) ([]byte, []byte, int, error) {
		return []byte("not ready"), nil, 1, nil
	}}
	p := probe.NewProber(probe.Options{Execer: e})
	spec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"check"}}}, TimeoutSeconds: 1}
	r, err := p.ProbeOnce(context.Background(), spec, probe.Target{ContainerID: "cid"})
	require.NoError(t, err)
	assert.Equal(t, probe.Result{Kind: probe.Failure, Message: "not ready"}, r)
	require.Len(t, e.Commands(), 1)
	assert.Equal(t, "cid", e.Commands()[0].ContainerID)
}

func TestStatuses(t *testing.T) {
	var s probetest.Statuses
	_, ok := s.PodStatus("a")
	assert.False(t, ok)

	st := corev1.PodStatus{PodIP: "10.0.0.7", ContainerStatuses: []corev1.ContainerStatus{{Name: "app"}}}
	s.Set("a", st)
	st.ContainerStatuses[0].Name = "changed"
	got, ok := s.PodStatus("a")
	require.True(t, ok)
	assert.Equal(t, "10.0.0.7", got.PodIP)
	assert.Equal(t, "app", got.ContainerStatuses[0].Name, "Set stores a copy")

	s.Delete("a")
	_, ok = s.PodStatus("a")
	assert.False(t, ok)
}

func TestMetrics(t *testing.T) {
	var m probetest.Metrics
	l := probe.MetricLabels{ProbeType: "Readiness", Container: "app", Pod: "p", Namespace: "ns", PodUID: "u"}
	other := l
	other.Container = "side"
	assert.Zero(t, m.Count(l, "successful"))
	assert.Empty(t, m.Durations(l))
	assert.Empty(t, m.Gone())

	m.ProbeCounted(l, "successful")
	m.ProbeCounted(l, "successful")
	m.ProbeCounted(l, "failed")
	m.ProbeDuration(l, time.Millisecond)
	m.ProbeDuration(l, 2*time.Millisecond)
	m.WorkerGone(other)

	assert.Equal(t, 2, m.Count(l, "successful"))
	assert.Equal(t, 1, m.Count(l, "failed"))
	assert.Zero(t, m.Count(other, "successful"))
	assert.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond}, m.Durations(l))
	assert.Equal(t, []probe.MetricLabels{other}, m.Gone())
}

func TestEvents(t *testing.T) {
	var e probetest.Events
	assert.Empty(t, e.Recorded())
	pod := &corev1.Pod{}
	pod.UID = types.UID("uid-1")
	e.Event(pod, "app", corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: x")
	assert.Equal(t, []probetest.Event{{PodUID: "uid-1", Container: "app", Type: "Warning", Reason: "Unhealthy", Message: "Readiness probe failed: x"}}, e.Recorded())
}
