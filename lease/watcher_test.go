package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nodekit-dev/nodekit/lease/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

func TestExpiryAndFresh(t *testing.T) {
	l := leasetest.Lease(ns, node, node, t0, 40*time.Second)
	tests := []struct {
		name      string
		lease     *coordinationv1.Lease
		now       time.Time
		wantFresh bool
		wantErr   bool
	}{
		{"just renewed", l, t0, true, false},
		{"a moment before expiry", l, t0.Add(40*time.Second - time.Nanosecond), true, false},
		{"at expiry", l, t0.Add(40 * time.Second), false, false},
		{"long gone", l, t0.Add(time.Hour), false, false},
		{"holder clock ahead: renewTime in the reader's future", l, t0.Add(-10 * time.Second), true, false},
		{"no renewTime", &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40)}}, t0, false, true},
		{"no duration", &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: t0}}}, t0, false, true},
		{"nil", nil, t0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.wantFresh, Fresh(tt.lease, tt.now))
			exp, err := Expiry(tt.lease)
			if tt.wantErr {
				assert.ErrorIs(t, err, ErrIncompleteLease)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, t0.Add(40*time.Second), exp)
		})
	}
}

func TestNewWatcherValidation(t *testing.T) {
	on := func(Transition) {}
	tests := []struct {
		name    string
		cfg     WatcherConfig
		wantErr string
	}{
		{"defaults", WatcherConfig{Client: fake.NewClientset(), OnTransition: on}, ""},
		{"nil client", WatcherConfig{OnTransition: on}, "nil Client"},
		{"nil callback", WatcherConfig{Client: fake.NewClientset()}, "nil OnTransition"},
		{"negative grace", WatcherConfig{Client: fake.NewClientset(), OnTransition: on, GracePeriod: -1}, "GracePeriod -1ns is negative"},
		{"negative period", WatcherConfig{Client: fake.NewClientset(), OnTransition: on, MonitorPeriod: -1}, "MonitorPeriod -1ns is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := NewWatcher(tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, "kube-node-lease", w.cfg.Namespace)
				assert.Equal(t, 50*time.Second, w.cfg.GracePeriod)
				assert.Equal(t, 5*time.Second, w.cfg.MonitorPeriod)
				return
			}
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestWatcherJudgesLikeNodeLifecycle drives the verdict directly: the grace period
// counts from the Watcher's own observation of a renewTime change, never from the
// renewTime value.
func TestWatcherJudgesLikeNodeLifecycle(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	w, err := NewWatcher(WatcherConfig{Client: fake.NewClientset(), OnTransition: func(Transition) {}, Clock: clk, GracePeriod: 40 * time.Second})
	require.NoError(t, err)

	// The holder's clock is an hour behind: a reader comparing renewTime with its
	// own clock would call it stale at once. The Watcher does not.
	skewed := leasetest.Lease(ns, "slow-clock", "slow-clock", t0.Add(-time.Hour), 40*time.Second)
	quiet := leasetest.Lease(ns, "quiet", "quiet", t0, 40*time.Second)
	w.saw(skewed)
	w.saw(quiet)
	assert.Empty(t, w.judge())

	renew := func(l *coordinationv1.Lease) {
		l = l.DeepCopy()
		l.Spec.RenewTime = &metav1.MicroTime{Time: l.Spec.RenewTime.Add(clk.Since(t0))}
		w.saw(l)
	}
	for s := 5; s <= 40; s += 5 {
		clk.SetTime(t0.Add(time.Duration(s) * time.Second))
		renew(skewed)
		assert.Empty(t, w.judge(), "at +%ds", s)
	}
	// Exactly the grace period since quiet was first seen is not yet stale...
	clk.SetTime(t0.Add(40 * time.Second))
	assert.Empty(t, w.judge())
	// ...one tick later it is; slow-clock, renewed at +40s, is not.
	clk.SetTime(t0.Add(45 * time.Second))
	got := w.judge()
	require.Len(t, got, 1)
	assert.Equal(t, Transition{Namespace: ns, Name: "quiet", Holder: "quiet", Stale: true,
		RenewTime: t0, LastChange: t0, At: t0.Add(45 * time.Second)}, got[0])
	assert.Equal(t, `lease kube-node-lease/quiet (holder "quiet") went stale`, got[0].String())
	assert.Empty(t, w.judge(), "reported once")

	// The same renewTime again (a resync) is not a sign of life.
	w.saw(quiet)
	clk.SetTime(t0.Add(50 * time.Second))
	assert.Empty(t, w.judge())

	// A newer renewTime is, whatever its value.
	back := quiet.DeepCopy()
	back.Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(time.Second)}
	w.saw(back)
	got = w.judge()
	require.Len(t, got, 1)
	assert.False(t, got[0].Stale)
	assert.Equal(t, t0.Add(50*time.Second), got[0].LastChange)

	// A deleted lease is forgotten, not reported.
	w.forget(back)
	clk.SetTime(t0.Add(time.Hour))
	got = w.judge()
	require.Len(t, got, 1)
	assert.Equal(t, "slow-clock", got[0].Name)
}

func TestWatcherRun(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := testingclock.NewFakeClock(t0)
	api := leasetest.New([]runtime.Object{
		leasetest.Lease(ns, "node-a", "node-a", t0, 40*time.Second),
		leasetest.Lease(ns, "node-b", "node-b", t0, 40*time.Second),
	}...)
	transitions := make(chan Transition, 10)
	w, err := NewWatcher(WatcherConfig{
		Client: api.Clientset, Clock: clk, GracePeriod: 10 * time.Second, MonitorPeriod: time.Second,
		OnTransition: func(tr Transition) { transitions <- tr },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
		})
	}
	defer stop()

	seen := func(name string, renew time.Time) func() bool {
		return func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			o, ok := w.leases[name]
			return ok && o.renewTime.Equal(renew)
		}
	}
	require.Eventually(t, seen("node-a", t0), 5*time.Second, time.Millisecond)
	require.Eventually(t, seen("node-b", t0), 5*time.Second, time.Millisecond)
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond)

	// node-a keeps renewing through the API, node-b goes quiet.
	for s := 1; s <= 11; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		require.NoError(t, api.SetRenewTime(ns, "node-a", now))
		require.Eventually(t, seen("node-a", now), 5*time.Second, time.Millisecond)
		clk.SetTime(now)
	}
	tr := nextTransition(t, transitions, "no transition for node-b")
	assert.Equal(t, "node-b", tr.Name)
	assert.True(t, tr.Stale)

	// node-b comes back.
	back := t0.Add(12 * time.Second)
	require.NoError(t, api.SetRenewTime(ns, "node-b", back))
	require.Eventually(t, seen("node-b", back), 5*time.Second, time.Millisecond)
	clk.Step(time.Second)
	tr = nextTransition(t, transitions, "node-b never came back")
	assert.Equal(t, "node-b", tr.Name)
	assert.False(t, tr.Stale)
	assert.Empty(t, transitions, "node-a must never be reported")

	stop()
	// A stopped Watcher may run again.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	assert.NoError(t, w.Run(ctx))
}

// nextTransition waits up to 5s for the next Transition, failing with msg if none comes.
func nextTransition(t *testing.T, transitions <-chan Transition, msg string) Transition {
	t.Helper()
	select {
	case tr := <-transitions:
		return tr
	case <-time.After(5 * time.Second):
		t.Fatal(msg)
		return Transition{}
	}
}
