package probe_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodekit-dev/nodekit/probe"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestDensity runs pods with a liveness and a readiness probe each (5,000 pods by
// default, so 10,000 workers; PROBE_DENSITY_PODS changes it) at a 10 s period on
// the real clock and measures the CPU the whole test process uses over a window. PROBE_DENSITY=fake measures the manager alone (probes
// answered in memory); PROBE_DENSITY=tcp probes a loopback listener for real.
// It takes PROBE_DENSITY_SECONDS (default 60) plus a 10 s warm-up.
func TestDensity(t *testing.T) {
	mode := os.Getenv("PROBE_DENSITY")
	if mode == "" {
		t.Skip("set PROBE_DENSITY=fake or tcp to run the density measurement (70 s)")
	}
	pods := 5000
	if v := os.Getenv("PROBE_DENSITY_PODS"); v != "" {
		pods, _ = strconv.Atoi(v)
	}
	window := 60 * time.Second
	if v := os.Getenv("PROBE_DENSITY_SECONDS"); v != "" {
		n, _ := strconv.Atoi(v)
		window = time.Duration(n) * time.Second
	}
	var coalesce time.Duration // PROBE_DENSITY_COALESCE=-1 gives the kubelet's exact phases
	if v := os.Getenv("PROBE_DENSITY_COALESCE"); v != "" {
		coalesce, _ = time.ParseDuration(v)
	}
	var probes atomic.Int64
	var runner probe.Runner
	port := 80
	switch mode {
	case "tcp":
		ln := closingListener(t)
		_, port = hostPort(t, ln.Addr().String())
		p := probe.NewProber(probe.Options{ResetTCPProbes: true})
		runner = countingRunner{p, &probes}
	default:
		runner = countingRunner{instant{}, &probes}
	}
	// A read-only map: the agent's pod cache costs nothing here, so the figure is
	// the manager's own.
	statuses := map[types.UID]*corev1.PodStatus{}
	m, err := probe.NewManager(probe.Config{Status: probe.PodStatusFunc(func(uid types.UID) (*corev1.PodStatus, bool) {
		st, ok := statuses[uid]
		return st, ok
	}), Prober: runner, UpdatesBuffer: 100, Coalesce: coalesce})
	require.NoError(t, err)
	spec := func() *corev1.Probe {
		return &corev1.Probe{PeriodSeconds: 10, ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}}
	}
	started := true
	for i := range pods {
		uid := types.UID(fmt.Sprintf("uid-%d", i))
		statuses[uid] = &corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", ContainerStatuses: []corev1.ContainerStatus{{
			Name: "c", ContainerID: fmt.Sprintf("containerd://%d", i), Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		}}}
		require.NoError(t, m.AddPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: string(uid), Namespace: "d", UID: uid},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", LivenessProbe: spec(), ReadinessProbe: spec()}}}}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	go func() {
		for {
			select {
			case <-m.Updates():
			case <-ctx.Done():
				return
			}
		}
	}()
	time.Sleep(10 * time.Second)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	c0, p0, w0 := cpuTime(), probes.Load(), time.Now()
	time.Sleep(window)
	c1, p1, w1 := cpuTime(), probes.Load(), time.Now()
	runtime.ReadMemStats(&ms1)
	cancel()
	<-done
	share := float64(c1-c0) / float64(w1.Sub(w0))
	t.Logf("coalesce=%v mode=%s workers=%d window=%v probes=%d (%.0f/s) cpu=%v = %.2f%% of one core, %.1f allocs/probe, %d GCs",
		coalesce, mode, 2*pods, w1.Sub(w0).Round(time.Millisecond), p1-p0, float64(p1-p0)/w1.Sub(w0).Seconds(), (c1 - c0).Round(time.Millisecond), 100*share,
		float64(ms1.Mallocs-ms0.Mallocs)/float64(p1-p0), ms1.NumGC-ms0.NumGC)
	if mode == "fake" {
		assert.Less(t, share, 0.05, "manager CPU at %d workers", 2*pods)
	}
}

type countingRunner struct {
	r probe.Runner
	n *atomic.Int64
}

func (c countingRunner) Probe(ctx context.Context, spec *corev1.Probe, target probe.Target) (probe.Result, error) {
	c.n.Add(1)
	return c.r.Probe(ctx, spec, target)
}

// instant answers every probe with Success at once.
type instant struct{}

func (instant) Probe(context.Context, *corev1.Probe, probe.Target) (probe.Result, error) {
	return probe.Result{Kind: probe.Success}, nil
}
