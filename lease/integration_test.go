package lease_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/lease"
)

// These tests run the Controller and Watcher against a real etcd + kube-apiserver
// (Node authorizer, NodeRestriction) + kube-controller-manager, with the
// credentials of a real node (system:node:<name>). One control plane serves all
// subtests; each uses its own node names.
//
// Leases last 4s (renewed every 1s) so the timings below stay short; the node
// lifecycle controller runs with a 10s grace period and a 1s monitor period.
const (
	itDuration = 4 * time.Second
	itInterval = time.Second
	itGrace    = 10 * time.Second
	itMonitor  = time.Second
)

func TestAgainstControlPlane(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{
		ControllerManager:      true,
		NodeMonitorGracePeriod: itGrace,
		NodeMonitorPeriod:      itMonitor,
	})
	t.Run("node identity writes an owned lease, one Update per round", func(t *testing.T) { testOwnedLease(t, cp) })
	t.Run("another node's lease is forbidden", func(t *testing.T) { testForbidden(t, cp) })
	t.Run("silent heartbeat makes the node Unknown, then it recovers", func(t *testing.T) { testNotReady(t, cp) })
	// Last: kube-controller-manager is not expected to survive kube-apiserver's restart.
	t.Run("renewals resume after kube-apiserver restarts", func(t *testing.T) { testAPIServerRestart(t, cp) })
}

// requestLog counts the lease requests a client sends, by method.
type requestLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func (r *requestLog) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 5 * time.Second // the kubelet's heartbeat client has a timeout too
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.Contains(req.URL.Path, "/leases") {
				r.mu.Lock()
				r.counts[req.Method]++
				r.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	}
	return cfg
}

func (r *requestLog) take() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.counts
	r.counts = map[string]int{}
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// runHeartbeat starts node's heartbeat with the node's own identity and returns
// a stop function that cancels it and waits for Run to return.
func runHeartbeat(t *testing.T, client kubernetes.Interface, node string, log logr.Logger) (stop func()) {
	t.Helper()
	cfg := lease.NodeConfig(client, node)
	cfg.Duration = itDuration
	c, err := lease.New(cfg)
	require.NoError(t, err)
	require.Equal(t, itInterval, c.RenewInterval())
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), log))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Error("Run did not return within 10s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// renewTimes polls the lease as admin and returns each distinct renewTime seen
// until n were seen or timeout passed.
func renewTimes(t *testing.T, admin kubernetes.Interface, node string, n int, timeout time.Duration) []time.Time {
	t.Helper()
	var seen []time.Time
	deadline := time.Now().Add(timeout)
	for len(seen) < n && time.Now().Before(deadline) {
		l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), node, metav1.GetOptions{})
		if err == nil && l.Spec.RenewTime != nil {
			rt := l.Spec.RenewTime.Time
			if len(seen) == 0 || rt.After(seen[len(seen)-1]) {
				seen = append(seen, rt)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return seen
}

func getLease(t *testing.T, admin kubernetes.Interface, node string) *coordinationv1.Lease {
	t.Helper()
	var l *coordinationv1.Lease
	require.Eventually(t, func() bool {
		var err error
		l, err = admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), node, metav1.GetOptions{})
		return err == nil
	}, 15*time.Second, 50*time.Millisecond, "lease %s never appeared", node)
	return l
}

func testOwnedLease(t *testing.T, cp *controlplane.ControlPlane) {
	const node = "lease-owned"
	registered := cp.CreateNode(t, node)
	reqs := &requestLog{counts: map[string]int{}}
	client := kubernetes.NewForConfigOrDie(reqs.wrap(cp.NodeConfig(node)))
	runHeartbeat(t, client, node, logr.Discard())

	l := getLease(t, cp.AdminClient(), node)
	assert.Equal(t, node, *l.Spec.HolderIdentity)
	assert.Equal(t, int32(4), *l.Spec.LeaseDurationSeconds)
	require.Len(t, l.OwnerReferences, 1)
	assert.Equal(t, metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node, UID: registered.UID}, l.OwnerReferences[0])

	// renewTime advances every interval (+ up to 4% jitter + one request).
	times := renewTimes(t, cp.AdminClient(), node, 5, 15*time.Second)
	require.Len(t, times, 5, "renewTime did not advance 4 times in 15s")
	for i := 1; i < len(times); i++ {
		gap := times[i].Sub(times[i-1])
		assert.GreaterOrEqual(t, gap, itInterval, "gap %d", i)
		assert.Less(t, gap, itInterval+itInterval*4/100+500*time.Millisecond, "gap %d", i)
	}

	// Steady state on the wire: one PUT per round, no GET.
	reqs.take()
	start := time.Now()
	time.Sleep(5 * time.Second)
	got := reqs.take()
	rounds := time.Since(start).Seconds() / itInterval.Seconds()
	t.Logf("steady state over %.1f rounds: %v", rounds, got)
	assert.Zero(t, got["GET"], "steady state must not read the lease")
	assert.Zero(t, got["POST"])
	assert.InDelta(t, rounds, float64(got["PUT"]), 1.5, "one Update per round")
}

func testForbidden(t *testing.T, cp *controlplane.ControlPlane) {
	const self, other = "lease-self", "lease-other"
	cp.CreateNode(t, self)
	cp.CreateNode(t, other)

	var mu sync.Mutex
	var errorsLogged []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		errorsLogged = append(errorsLogged, args)
		mu.Unlock()
	}, funcr.Options{})

	// self's credentials, other's lease.
	cfg := lease.NodeConfig(cp.NodeClient(self), other)
	cfg.Duration = itDuration
	failures := &countingMetrics{}
	cfg.Metrics = failures
	c, err := lease.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(logr.NewContext(context.Background(), log), 3*time.Second)
	defer cancel()
	require.NoError(t, c.Run(ctx))

	_, err = cp.AdminClient().CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), other, metav1.GetOptions{})
	assert.Error(t, err, "the lease must not have been created")
	assert.Greater(t, failures.failures(), 1, "the refused requests are counted")

	mu.Lock()
	defer mu.Unlock()
	var found string
	for _, line := range errorsLogged {
		if strings.Contains(line, "forbidden") {
			found = line
			break
		}
	}
	require.NotEmpty(t, found, "no forbidden error logged; logs: %v", errorsLogged)
	t.Logf("error logged: %s", found)
	assert.Contains(t, found, `get lease kube-node-lease/lease-other`, "the error names the lease")
	assert.Contains(t, found, `system:node:lease-self`, "the error names the identity")
	assert.Contains(t, found, "can only access node lease with the same name as the requesting node")
}

type countingMetrics struct {
	mu sync.Mutex
	n  int
}

func (m *countingMetrics) RenewLatency(time.Duration) {}
func (m *countingMetrics) RenewFailure(string)        { m.mu.Lock(); m.n++; m.mu.Unlock() }
func (m *countingMetrics) ConsecutiveFailures(int)    {}
func (m *countingMetrics) failures() int              { m.mu.Lock(); defer m.mu.Unlock(); return m.n }

func testAPIServerRestart(t *testing.T, cp *controlplane.ControlPlane) {
	const node = "lease-restart"
	cp.CreateNode(t, node)
	reqs := &requestLog{counts: map[string]int{}}
	runHeartbeat(t, kubernetes.NewForConfigOrDie(reqs.wrap(cp.NodeConfig(node))), node, logr.Discard())
	require.Len(t, renewTimes(t, cp.AdminClient(), node, 2, 10*time.Second), 2, "heartbeat not running")

	cp.StopAPIServer(t)
	// Long enough for the GET backoff to reach its cap.
	time.Sleep(2 * lease.MaxBackoff)
	cp.StartAPIServer(t)
	back := time.Now()
	before := getLease(t, cp.AdminClient(), node).Spec.RenewTime.Time

	// The controller is at most one capped backoff (7s) away from its next GET, and
	// then renews at once.
	times := renewTimes(t, cp.AdminClient(), node, 2, lease.MaxBackoff+5*time.Second)
	require.Len(t, times, 2, "renewTime did not advance within %v of kube-apiserver's return", lease.MaxBackoff+5*time.Second)
	resumed := times[1]
	require.True(t, resumed.After(before))
	t.Logf("renewals resumed %v after kube-apiserver was ready again", resumed.Sub(back).Round(time.Millisecond))
	assert.LessOrEqual(t, resumed.Sub(back), lease.MaxBackoff+itInterval+time.Second)
}

func testNotReady(t *testing.T, cp *controlplane.ControlPlane) {
	const node = "lease-notready"
	admin := cp.AdminClient()
	nodeClient := cp.NodeClient(node)
	cp.CreateNode(t, node)
	stopHeartbeat := runHeartbeat(t, nodeClient, node, logr.Discard())
	getLease(t, admin, node)
	postReady(t, nodeClient, node)
	require.Equal(t, corev1.ConditionTrue, readyCondition(t, admin, node).Status)

	// The reader side watches the same leases with the same rule.
	transitions := make(chan lease.Transition, 10)
	w, err := lease.NewWatcher(lease.WatcherConfig{
		Client: admin, GracePeriod: itGrace, MonitorPeriod: itMonitor,
		OnTransition: func(tr lease.Transition) {
			if tr.Name == node {
				transitions <- tr
			}
		},
	})
	require.NoError(t, err)
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	defer func() {
		wcancel()
		assert.NoError(t, <-wdone)
	}()

	// The node stays Ready while the heartbeat runs, well past the grace period...
	time.Sleep(itGrace + 2*itMonitor)
	assert.Equal(t, corev1.ConditionTrue, readyCondition(t, admin, node).Status, "Ready while the lease is renewed")
	assert.Empty(t, transitions)

	// ...and goes Unknown within grace + monitor period of the heartbeat stopping.
	stopHeartbeat()
	stopped := time.Now()
	var cond corev1.NodeCondition
	if !assert.Eventually(t, func() bool {
		cond = readyCondition(t, admin, node)
		return cond.Status == corev1.ConditionUnknown
	}, itGrace+itMonitor+5*time.Second, 100*time.Millisecond, "Ready never became Unknown") {
		logTail(t, filepath.Join(cp.Dir(), "logs", "kube-controller-manager.log"))
		t.FailNow()
	}
	took := time.Since(stopped)
	t.Logf("Ready=Unknown %v after the heartbeat stopped: reason %s, message %q", took.Round(time.Millisecond), cond.Reason, cond.Message)
	assert.Equal(t, "NodeStatusUnknown", cond.Reason)
	assert.Equal(t, "Kubelet stopped posting node status.", cond.Message)
	// The last renewal was at most one interval before the stop.
	assert.GreaterOrEqual(t, took, itGrace-itInterval*104/100-500*time.Millisecond, "Unknown before the grace period")
	assert.LessOrEqual(t, took, itGrace+itMonitor+2*time.Second, "Unknown later than grace + monitor period")

	select {
	case tr := <-transitions:
		assert.True(t, tr.Stale, "watcher: %v", tr)
	case <-time.After(5 * time.Second):
		t.Error("the Watcher did not report the lease stale")
	}

	// Heartbeat again and post Ready: the node recovers.
	runHeartbeat(t, nodeClient, node, logr.Discard())
	postReady(t, nodeClient, node)
	require.Eventually(t, func() bool {
		return readyCondition(t, admin, node).Status == corev1.ConditionTrue
	}, 10*time.Second, 100*time.Millisecond, "node did not recover")
	// It stays Ready: the lifecycle controller counts the renewed lease.
	time.Sleep(itGrace/2 + itMonitor)
	assert.Equal(t, corev1.ConditionTrue, readyCondition(t, admin, node).Status)
	select {
	case tr := <-transitions:
		assert.False(t, tr.Stale, "watcher: %v", tr)
	case <-time.After(5 * time.Second):
		t.Error("the Watcher did not report the lease back")
	}
}

// postReady writes Ready=True into the node's status with the node's identity,
// retrying on Conflict: the node lifecycle controller writes the Node too.
func postReady(t *testing.T, client kubernetes.Interface, node string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		ready := corev1.NodeCondition{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "nodekit lease test", LastHeartbeatTime: now, LastTransitionTime: now,
		}
		replaced := false
		for i, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					ready.LastTransitionTime = c.LastTransitionTime
				}
				n.Status.Conditions[i] = ready
				replaced = true
			}
		}
		if !replaced {
			n.Status.Conditions = append(n.Status.Conditions, ready)
		}
		_, err = client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	require.NoError(t, err, "post Ready for node %s", node)
}

func readyCondition(t *testing.T, client kubernetes.Interface, node string) corev1.NodeCondition {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	require.NoError(t, err)
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionStatus(fmt.Sprintf("absent (%d conditions)", len(n.Status.Conditions)))}
}

// logTail logs the end of a peer's log, to explain a failure.
func logTail(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("no log: %v", err)
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("%s (last %d lines):\n%s", path, len(lines), strings.Join(lines, "\n"))
}
