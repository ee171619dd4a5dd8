package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodekit-dev/nodekit/lease/leasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
)

const (
	ns   = corev1.NamespaceNodeLease
	node = "node-1"
	uid  = "uid-node-1"
)

var t0 = time.Date(2026, 7, 16, 9, 14, 0, 0, time.UTC)

// recMetrics records what the controller reports.
type recMetrics struct {
	mu          sync.Mutex
	latencies   int
	failures    []string
	consecutive []int
}

func (m *recMetrics) RenewLatency(time.Duration) { m.mu.Lock(); m.latencies++; m.mu.Unlock() }
func (m *recMetrics) RenewFailure(op string) {
	m.mu.Lock()
	m.failures = append(m.failures, op)
	m.mu.Unlock()
}
func (m *recMetrics) ConsecutiveFailures(n int) {
	m.mu.Lock()
	m.consecutive = append(m.consecutive, n)
	m.mu.Unlock()
}
func (m *recMetrics) snapshot() (int, []string, []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.latencies, append([]string(nil), m.failures...), append([]int(nil), m.consecutive...)
}

// harness runs a Controller against a leasetest.Fake on a fake clock.
type harness struct {
	t         *testing.T
	clk       *testingclock.FakeClock
	api       *leasetest.Fake
	c         *Controller
	metrics   *recMetrics
	callbacks atomic.Int32
	cancel    context.CancelFunc
	done      chan error
}

// newHarness builds the controller for node-1's lease (node defaults) unless
// configure changes the Config; jitter is off so waits are exact.
func newHarness(t *testing.T, objs []runtime.Object, configure func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, clk: testingclock.NewFakeClock(t0), api: leasetest.New(objs...), metrics: &recMetrics{}}
	cfg := NodeConfig(h.api.Clientset, node)
	cfg.Clock = h.clk
	cfg.Metrics = h.metrics
	cfg.OnRepeatedFailure = func() { h.callbacks.Add(1) }
	if configure != nil {
		configure(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	c.jitter = func(d time.Duration) time.Duration { return d }
	h.c = c
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.c.Run(ctx) }()
	h.t.Cleanup(h.stop)
	h.waitBlocked()
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		assert.NoError(h.t, err)
	case <-time.After(5 * time.Second):
		h.t.Fatal("Run did not return after cancel")
	}
	h.cancel = nil
}

// waitBlocked waits until the controller sleeps on the fake clock, i.e. it has
// finished everything it can do at the current fake time.
func (h *harness) waitBlocked() {
	h.t.Helper()
	require.Eventually(h.t, h.clk.HasWaiters, 5*time.Second, time.Millisecond, "controller never waited on the clock")
}

// step advances the fake clock by d and waits for the controller to sleep again.
func (h *harness) step(d time.Duration) {
	h.t.Helper()
	h.clk.Step(d)
	h.waitBlocked()
}

// requests returns the recorded requests and forgets them.
func (h *harness) requests() []string {
	r := h.api.Requests()
	h.api.ResetRequests()
	return r
}

func (h *harness) lease() *coordinationv1.Lease {
	h.t.Helper()
	l, err := h.api.Lease(ns, node)
	require.NoError(h.t, err)
	return l
}

func nodeObj() *corev1.Node { return leasetest.Node(node, uid) }

const (
	getLease    = "get lease kube-node-lease/node-1"
	createLease = "create lease kube-node-lease/node-1"
	updateLease = "update lease kube-node-lease/node-1"
	getNode     = "get node node-1"
)

func TestCreateWithOwner(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, []runtime.Object{nodeObj()}, nil)
	h.start()

	assert.Equal(t, []string{getLease, getNode, createLease}, h.requests())
	l := h.lease()
	assert.Equal(t, node, *l.Spec.HolderIdentity)
	assert.Equal(t, int32(40), *l.Spec.LeaseDurationSeconds)
	assert.True(t, l.Spec.RenewTime.Time.Equal(t0), "renewTime %v", l.Spec.RenewTime)
	assert.Equal(t, []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: uid}}, l.OwnerReferences)
	lat, fails, _ := h.metrics.snapshot()
	assert.Equal(t, 1, lat)
	assert.Empty(t, fails)
	h.stop()
}

func TestSteadyRenewNeverReads(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, []runtime.Object{nodeObj()}, nil)
	h.start()
	h.requests()

	for i := 1; i <= 5; i++ {
		// Nothing happens a moment before the interval ends...
		h.clk.Step(10*time.Second - time.Millisecond)
		assert.Empty(t, h.api.Requests(), "round %d started early", i)
		// ...and exactly one Update, with no GET, when it does.
		h.step(time.Millisecond)
		assert.Equal(t, []string{updateLease}, h.requests(), "round %d", i)
		assert.True(t, h.lease().Spec.RenewTime.Time.Equal(h.clk.Now()), "round %d renewTime", i)
	}
	assert.Equal(t, int32(0), h.callbacks.Load())
	h.stop()
}

func TestConflictRereadsThenUpdates(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, []runtime.Object{nodeObj()}, nil)
	h.start()
	h.requests()

	// Another writer touches the lease: our cached resourceVersion is now stale.
	require.NoError(t, h.api.SetRenewTime(ns, node, t0.Add(time.Second)))
	h.step(10 * time.Second)
	assert.Equal(t, []string{updateLease, getLease, updateLease}, h.requests())
	assert.True(t, h.lease().Spec.RenewTime.Time.Equal(h.clk.Now()))
	assert.Equal(t, int32(0), h.callbacks.Load(), "a Conflict is not a heartbeat failure")

	// Back to the optimistic path.
	h.step(10 * time.Second)
	assert.Equal(t, []string{updateLease}, h.requests())
	h.stop()
}

func TestUpdateFailures(t *testing.T) {
	u5 := []string{updateLease, updateLease, updateLease, updateLease, updateLease}
	tests := []struct {
		name          string
		failures      int
		wantRound     []string
		wantCallbacks int32
		wantMaxConsec int
		nextRound     []string
	}{
		{
			name:          "5 failures then recovery in the same round",
			failures:      5,
			wantRound:     append(append(append([]string{}, u5...), getLease), updateLease),
			wantCallbacks: 4,
			wantMaxConsec: 5,
			nextRound:     []string{updateLease},
		},
		{
			name:          "10 failures: the round gives up, the next recovers from the re-read copy",
			failures:      10,
			wantRound:     append(append(append([]string{}, u5...), getLease), u5...),
			wantCallbacks: 8,
			wantMaxConsec: 10,
			nextRound:     []string{updateLease},
		},
		{
			name:          "1 failure: no callback",
			failures:      1,
			wantRound:     []string{updateLease, updateLease},
			wantCallbacks: 0,
			wantMaxConsec: 1,
			nextRound:     []string{updateLease},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			h := newHarness(t, []runtime.Object{nodeObj()}, nil)
			h.start()
			h.requests()
			h.api.FailNext("update", "leases", tt.failures, leasetest.ServerTimeout())

			h.step(10 * time.Second)
			assert.Equal(t, tt.wantRound, h.requests())
			assert.Equal(t, tt.wantCallbacks, h.callbacks.Load())
			_, fails, consec := h.metrics.snapshot()
			assert.Len(t, fails, tt.failures)
			maxConsec := 0
			for _, n := range consec {
				maxConsec = max(maxConsec, n)
			}
			assert.Equal(t, tt.wantMaxConsec, maxConsec)

			h.step(10 * time.Second)
			assert.Equal(t, tt.nextRound, h.requests())
			assert.True(t, h.lease().Spec.RenewTime.Time.Equal(h.clk.Now()))
			_, _, consec = h.metrics.snapshot()
			assert.Equal(t, 0, consec[len(consec)-1], "consecutive failures reset by a successful write")
			h.stop()
		})
	}
}

func TestEnsureBackoff(t *testing.T) {
	tests := []struct {
		name     string
		verb     string
		failures int
		waits    []time.Duration
	}{
		{"get fails 5 times", "get", 5, []time.Duration{200, 400, 800, 1600, 3200}},
		{"create fails 3 times", "create", 3, []time.Duration{200, 400, 800}},
		{"get fails 8 times: capped at 7s", "get", 8, []time.Duration{200, 400, 800, 1600, 3200, 6400, 7000, 7000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			h := newHarness(t, []runtime.Object{nodeObj()}, nil)
			h.api.FailNext(tt.verb, "leases", tt.failures, leasetest.ServerTimeout())
			h.start()
			h.requests()
			for i, w := range tt.waits {
				w *= time.Millisecond
				h.clk.Step(w - time.Millisecond)
				assert.Empty(t, h.api.Requests(), "retry %d came before %v", i+1, w)
				h.step(time.Millisecond)
				got := h.requests()
				require.NotEmpty(t, got, "no retry after %v", w)
				assert.Equal(t, getLease, got[0], "retry %d", i+1)
			}
			l := h.lease()
			assert.True(t, l.Spec.RenewTime.Time.Equal(h.clk.Now()))
			assert.Equal(t, int32(0), h.callbacks.Load(), "ensure failures do not call OnRepeatedFailure")
			h.stop()
		})
	}
}

func TestOwnerReference(t *testing.T) {
	owned := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: uid}}

	t.Run("existing lease without owner gets it on the next renew", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		old := leasetest.Lease(ns, node, node, t0.Add(-time.Minute), 40*time.Second)
		h := newHarness(t, []runtime.Object{nodeObj(), old}, nil)
		h.start()
		assert.Equal(t, []string{getLease, getNode, updateLease}, h.requests())
		assert.Equal(t, owned, h.lease().OwnerReferences)
		h.step(10 * time.Second)
		assert.Equal(t, []string{updateLease}, h.requests(), "owner known: no more Node GETs")
		h.stop()
	})

	t.Run("node missing at start: no lease until the node exists", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		h := newHarness(t, nil, nil)
		h.start()
		assert.Equal(t, []string{getLease, getNode}, h.requests())
		_, err := h.api.Lease(ns, node)
		require.Error(t, err, "upstream never writes a node lease without its owner")

		// The next attempt is a whole renew interval later, not a backoff.
		h.clk.Step(10*time.Second - time.Millisecond)
		assert.Empty(t, h.api.Requests())
		h.step(time.Millisecond)
		assert.Equal(t, []string{getLease, getNode}, h.requests())

		require.NoError(t, h.api.Clientset.Tracker().Add(nodeObj()))
		h.step(10 * time.Second)
		assert.Equal(t, []string{getLease, getNode, createLease}, h.requests())
		assert.Equal(t, owned, h.lease().OwnerReferences)
		h.stop()
	})

	t.Run("existing lease, node missing: no update, callback on repeats", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		old := leasetest.Lease(ns, node, node, t0.Add(-time.Minute), 40*time.Second)
		h := newHarness(t, []runtime.Object{old}, nil)
		h.start()
		assert.Equal(t, []string{getLease, getNode, getNode, getNode, getNode, getNode}, h.requests())
		assert.True(t, h.lease().Spec.RenewTime.Time.Equal(t0.Add(-time.Minute)), "lease must not be renewed")
		assert.Equal(t, int32(4), h.callbacks.Load())

		require.NoError(t, h.api.Clientset.Tracker().Add(nodeObj()))
		h.step(10 * time.Second)
		// The lease read in the first round is the cached copy: no GET needed.
		assert.Equal(t, []string{getNode, updateLease}, h.requests())
		assert.Equal(t, owned, h.lease().OwnerReferences)
		h.stop()
	})
}

func TestAnyLease(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, nil, func(cfg *Config) {
		cfg.Namespace = "agents"
		cfg.Name = "disk-agent"
		cfg.HolderIdentity = "disk-agent-7f9c"
		cfg.Owner = nil
		cfg.Duration = 15 * time.Second
		cfg.RenewInterval = 0
	})
	h.start()
	assert.Equal(t, []string{"get lease agents/disk-agent", "create lease agents/disk-agent"}, h.requests())
	assert.Equal(t, 3750*time.Millisecond, h.c.RenewInterval())
	h.step(3750 * time.Millisecond)
	assert.Equal(t, []string{"update lease agents/disk-agent"}, h.requests())
	l, err := h.api.Lease("agents", "disk-agent")
	require.NoError(t, err)
	assert.Equal(t, "agents/disk-agent holder=disk-agent-7f9c duration=15s renew=2026-07-16T09:14:03.75Z owners=- rv=2", leasetest.Line(l))
	h.stop()
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *harness)
	}{
		{"while waiting to renew", func(*harness) {}},
		{"while backing off a failing GET", func(h *harness) {
			h.api.FailNext("get", "leases", 1000, leasetest.ServerTimeout())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			h := newHarness(t, []runtime.Object{nodeObj()}, nil)
			tt.setup(h)
			h.start()
			start := time.Now()
			h.cancel()
			select {
			case err := <-h.done:
				require.NoError(t, err)
			case <-time.After(time.Second):
				t.Fatal("Run did not return within 1s of cancel")
			}
			h.cancel = nil
			assert.Less(t, time.Since(start), time.Second)
			assert.False(t, h.clk.HasWaiters(), "timer left behind")
		})
	}
}

func TestRunTwice(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, []runtime.Object{nodeObj()}, nil)
	h.start()
	err := h.c.Run(context.Background())
	require.ErrorIs(t, err, ErrAlreadyRunning)
	assert.Contains(t, err.Error(), "kube-node-lease/node-1")
	h.stop()
}

func TestJitter(t *testing.T) {
	c, err := New(NodeConfig(fake.NewClientset(), node))
	require.NoError(t, err)
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := c.jitter(10 * time.Second)
		require.GreaterOrEqual(t, d, 10*time.Second)
		require.Less(t, d, 10400*time.Millisecond)
		seen[d] = true
	}
	assert.Greater(t, len(seen), 100, "waits are not jittered")
}

func TestNewValidation(t *testing.T) {
	client := fake.NewClientset()
	valid := func() Config { return NodeConfig(client, node) }
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string // substring; empty means valid
		wantDur time.Duration
		wantInt time.Duration
	}{
		{name: "node defaults", mutate: func(*Config) {}, wantDur: 40 * time.Second, wantInt: 10 * time.Second},
		{name: "short lease for tests", mutate: func(c *Config) { c.Duration = 4 * time.Second }, wantDur: 4 * time.Second, wantInt: time.Second},
		{name: "explicit interval", mutate: func(c *Config) { c.RenewInterval = 39 * time.Second }, wantDur: 40 * time.Second, wantInt: 39 * time.Second},
		{name: "nil client", mutate: func(c *Config) { c.Client = nil }, wantErr: "nil Client"},
		{name: "empty namespace", mutate: func(c *Config) { c.Namespace = "" }, wantErr: "empty Namespace"},
		{name: "empty name", mutate: func(c *Config) { c.Name = "" }, wantErr: "empty Name"},
		{name: "empty holder", mutate: func(c *Config) { c.HolderIdentity = "" }, wantErr: "empty HolderIdentity"},
		{name: "negative duration", mutate: func(c *Config) { c.Duration = -time.Second }, wantErr: "not positive"},
		{name: "sub-second duration", mutate: func(c *Config) { c.Duration = 500 * time.Millisecond }, wantErr: "not positive whole seconds"},
		{name: "fractional duration", mutate: func(c *Config) { c.Duration = 1500 * time.Millisecond }, wantErr: "whole number of seconds"},
		{name: "interval equal to duration", mutate: func(c *Config) { c.RenewInterval = 40 * time.Second }, wantErr: "not shorter than Duration"},
		{name: "interval longer than duration", mutate: func(c *Config) { c.Duration = 10 * time.Second; c.RenewInterval = time.Minute }, wantErr: "not shorter than Duration"},
		{name: "negative interval", mutate: func(c *Config) { c.RenewInterval = -time.Second }, wantErr: "RenewInterval -1s is not positive"},
		{name: "several problems at once", mutate: func(c *Config) { c.Name = ""; c.HolderIdentity = "" }, wantErr: "empty Name\nempty HolderIdentity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.mutate(&cfg)
			c, err := New(cfg)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrInvalidConfig)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Nil(t, c)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantDur, c.Duration())
			assert.Equal(t, tt.wantInt, c.RenewInterval())
		})
	}
}

func TestNodeOwnerError(t *testing.T) {
	_, err := NodeOwner(fake.NewClientset(), "ghost")(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), `Node "ghost"`)
	var status interface{ Status() metav1.Status }
	assert.True(t, errors.As(err, &status), "API error stays wrapped")
}

func TestDeletedLeaseIsRecreated(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newHarness(t, []runtime.Object{nodeObj()}, nil)
	h.start()
	h.requests()
	require.NoError(t, h.api.Clientset.CoordinationV1().Leases(ns).Delete(context.Background(), node, metav1.DeleteOptions{}))
	h.requests()

	// The cached copy fails 5 times (NotFound is not a Conflict), then the lease is
	// read, found missing and created again; a fresh create needs no Update.
	h.step(10 * time.Second)
	assert.Equal(t, []string{updateLease, updateLease, updateLease, updateLease, updateLease, getLease, getNode, createLease}, h.requests())
	assert.Equal(t, int32(4), h.callbacks.Load())
	assert.True(t, h.lease().Spec.RenewTime.Time.Equal(h.clk.Now()))
	h.step(10 * time.Second)
	assert.Equal(t, []string{updateLease}, h.requests())
	h.stop()
}
