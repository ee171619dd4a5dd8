package probe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// ErrStopped is returned by AddPod once the Manager's Run has returned.
var ErrStopped = errors.New("probe manager stopped")

// PodStatusProvider is how the Manager learns the current state of a pod it
// probes: the pod IP and each container's ID, state, StartedAt and Started flag.
// The kubelet's status manager plays this part upstream; a node agent implements
// it over its own pod cache. It must be safe for concurrent use and fast: every
// worker calls it once per period. The Manager only reads the returned status and
// may keep reading it after the call, so a provider must replace a status it
// holds rather than modify it in place.
type PodStatusProvider interface {
	PodStatus(uid types.UID) (*corev1.PodStatus, bool)
}

// PodStatusFunc adapts a function to PodStatusProvider.
type PodStatusFunc func(uid types.UID) (*corev1.PodStatus, bool)

// PodStatus calls f.
func (f PodStatusFunc) PodStatus(uid types.UID) (*corev1.PodStatus, bool) { return f(uid) }

// Runner runs a probe spec against a target with the kubelet's retry rule.
// *Prober implements it; probetest.Prober scripts it.
type Runner interface {
	Probe(ctx context.Context, spec *corev1.Probe, target Target) (Result, error)
}

// EventRecorder receives the events the kubelet would record for a probe:
// type Warning, reason "Unhealthy" (failed or errored probes) or "ProbeWarning".
type EventRecorder interface {
	Event(pod *corev1.Pod, container, eventType, reason, message string)
}

// Config configures a Manager. Zero fields take the documented defaults.
type Config struct {
	// Status supplies pod statuses. Required.
	Status PodStatusProvider
	// Prober runs probes. Default: NewProber(Options{}), which cannot run exec
	// probes; pass NewProber(Options{Execer: ...}) for those.
	Prober Runner
	// Clock drives periods, initial delays and the first random delay. Default: real.
	Clock clock.WithTicker
	// Metrics receives the prober metrics. Default: discard.
	Metrics Metrics
	// Events receives probe events. Default: discard.
	Events EventRecorder
	// UpdatesBuffer is the capacity of the Updates channel. Default 20 (the kubelet's).
	UpdatesBuffer int
	// Coalesce aligns every worker's ticks to multiples of this duration on the
	// clock, so workers wake together instead of one by one: thousands of
	// independent wake-ups cost far more CPU than the same work done in batches.
	// Periods stay exact; a worker's phase moves by less than Coalesce, once,
	// after its first probe. Default 100ms; a negative value keeps the kubelet's
	// exact phases. Use a divisor of one second.
	Coalesce time.Duration
}

// Update is a change of a cached probe result.
type Update struct {
	ContainerID string
	Type        Type
	Result      Kind
	PodUID      types.UID
}

type workerKey struct {
	podUID    types.UID
	container string
	typ       Type
}

// Manager runs one probe worker per (pod UID, container, probe type) with the
// kubelet's prober-manager rules, caches the results per container ID and
// pushes every change on Updates. Build it with NewManager, call Run, and feed it
// pods with AddPod / RemovePod / CleanupPods. All methods are safe for
// concurrent use.
type Manager struct {
	status  PodStatusProvider
	prober  Runner
	clock   clock.WithTicker
	metrics Metrics
	events  EventRecorder
	start   time.Time
	rand    func() float64
	grid    time.Duration

	results [3]resultCache
	updates chan Update

	mu      sync.Mutex
	workers map[workerKey]*worker
	ctx     context.Context // set while Run runs
	done    bool
	pending []*worker
	wg      sync.WaitGroup

	// probed, when set (tests), is called after every probe loop iteration.
	probed func(workerKey)
}

// NewManager validates cfg and returns a Manager. The manager's start time, which
// decides whether first probes wait a random part of their period, is now.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Status == nil {
		return nil, fmt.Errorf("%w: Status is required", ErrInvalidConfig)
	}
	if cfg.UpdatesBuffer < 0 {
		return nil, fmt.Errorf("%w: UpdatesBuffer %d is negative", ErrInvalidConfig, cfg.UpdatesBuffer)
	}
	m := &Manager{
		status:  cfg.Status,
		prober:  cfg.Prober,
		clock:   cfg.Clock,
		metrics: cfg.Metrics,
		events:  cfg.Events,
		rand:    rand.Float64,
		workers: map[workerKey]*worker{},
		grid:    cfg.Coalesce,
	}
	if m.grid == 0 {
		m.grid = 100 * time.Millisecond
	}
	if m.prober == nil {
		m.prober = NewProber(Options{})
	}
	if m.clock == nil {
		m.clock = clock.RealClock{}
	}
	if m.metrics == nil {
		m.metrics = NoopMetrics{}
	}
	if m.events == nil {
		m.events = noopEvents{}
	}
	n := cfg.UpdatesBuffer
	if n == 0 {
		n = 20
	}
	m.updates = make(chan Update, n)
	for i := range m.results {
		m.results[i].m = map[string]Kind{}
	}
	m.start = m.clock.Now()
	return m, nil
}

// toGrid returns how long from now until the next multiple of the coalescing
// grid (0 when now is on it or coalescing is off).
func (m *Manager) toGrid() time.Duration {
	if m.grid <= 0 {
		return 0
	}
	now := m.clock.Now().UnixNano()
	g := int64(m.grid)
	if r := now % g; r != 0 {
		return time.Duration(g - r)
	}
	return 0
}

// Run starts the workers added so far and every later one, and blocks until ctx
// ends; it then stops all workers, waits for them and returns nil. Workers log
// through the logr.Logger in ctx. Run may be called once.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil || m.done {
		m.mu.Unlock()
		return errors.New("probe manager: Run called twice")
	}
	m.ctx = ctx
	for _, w := range m.pending {
		m.startLocked(w)
	}
	m.pending = nil
	m.mu.Unlock()

	<-ctx.Done()
	m.mu.Lock()
	m.done = true
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

func (m *Manager) startLocked(w *worker) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		w.run(m.ctx)
	}()
}

// Updates returns the channel on which every change of a cached result is sent.
// As in the kubelet, sends block while the channel is full, so a user must keep
// draining it (sends give up when Run's ctx ends).
func (m *Manager) Updates() <-chan Update { return m.updates }

// Result returns the cached result of t for the container with this ID (as in
// ContainerStatus.ContainerID, for example "containerd://abc").
func (m *Manager) Result(t Type, containerID string) (Kind, bool) {
	if t < Liveness || t > Startup {
		return "", false
	}
	return m.results[t].get(containerID)
}

// WorkerCount returns the number of live workers.
func (m *Manager) WorkerCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.workers)
}

// restartableInit reports whether c is a sidecar (an init container with
// restartPolicy Always), the only kind of init container that is probed.
func restartableInit(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// AddPod starts workers for every probe of the pod's containers and sidecar init
// containers that has none yet. A pod already known (same UID) has its stored copy
// replaced, so a later deletionTimestamp reaches its workers; their state is kept
// and probe specs are not updated, as upstream. Invalid probe specs get no worker
// and are reported in the returned error (wrapping ErrInvalidProbe); valid ones
// still start.
func (m *Manager) AddPod(pod *corev1.Pod) error {
	if pod == nil {
		return fmt.Errorf("%w: nil pod", ErrInvalidProbe)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return ErrStopped
	}
	var errs []error
	containers := append([]corev1.Container(nil), pod.Spec.Containers...)
	for i := range pod.Spec.InitContainers {
		if restartableInit(&pod.Spec.InitContainers[i]) {
			containers = append(containers, pod.Spec.InitContainers[i])
		}
	}
	for i := range containers {
		c := &containers[i]
		for _, t := range []Type{Startup, Readiness, Liveness} {
			spec := specFor(c, t)
			if spec == nil {
				continue
			}
			key := workerKey{pod.UID, c.Name, t}
			if w, ok := m.workers[key]; ok {
				w.setPod(pod)
				continue
			}
			if err := Validate(spec, t, c); err != nil {
				errs = append(errs, fmt.Errorf("pod %s/%s container %q %s probe: %w", pod.Namespace, pod.Name, c.Name, strings.ToLower(t.String()), err))
				continue
			}
			w := newWorker(m, t, pod, *c, WithDefaults(spec))
			m.workers[key] = w
			if m.ctx != nil {
				m.startLocked(w)
			} else {
				m.pending = append(m.pending, w)
			}
		}
	}
	return errors.Join(errs...)
}

func specFor(c *corev1.Container, t Type) *corev1.Probe {
	switch t {
	case Liveness:
		return c.LivenessProbe
	case Readiness:
		return c.ReadinessProbe
	default:
		return c.StartupProbe
	}
}

// StopLivenessAndStartup stops the liveness and startup workers of the pod's
// containers, as the kubelet does when a pod starts terminating.
func (m *Manager) StopLivenessAndStartup(pod *corev1.Pod) {
	m.stopWhere(func(k workerKey) bool {
		return k.podUID == pod.UID && (k.typ == Liveness || k.typ == Startup)
	})
}

// RemovePod stops every worker of the pod; each removes its cached results.
func (m *Manager) RemovePod(pod *corev1.Pod) {
	m.stopWhere(func(k workerKey) bool { return k.podUID == pod.UID })
}

// CleanupPods stops the workers of every pod not in desired.
func (m *Manager) CleanupPods(desired map[types.UID]struct{}) {
	m.stopWhere(func(k workerKey) bool { _, ok := desired[k.podUID]; return !ok })
}

func (m *Manager) stopWhere(match func(workerKey) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.pending[:0]
	for _, w := range m.pending {
		if match(w.key) {
			delete(m.workers, w.key)
			continue
		}
		kept = append(kept, w)
	}
	m.pending = kept
	for k, w := range m.workers {
		if match(k) {
			w.stop()
		}
	}
}

func (m *Manager) removeWorker(w *worker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.workers[w.key] == w {
		delete(m.workers, w.key)
	}
}

func (m *Manager) worker(k workerKey) (*worker, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.workers[k]
	return w, ok
}

// setResult caches r and, when it changed, sends an Update (blocking, like the
// kubelet, until there is room or ctx ends).
func (m *Manager) setResult(ctx context.Context, t Type, containerID string, r Kind, podUID types.UID) {
	if !m.results[t].set(containerID, r) {
		return
	}
	select {
	case m.updates <- Update{ContainerID: containerID, Type: t, Result: r, PodUID: podUID}:
	case <-ctx.Done():
	}
}

// kubeletRestartGrace is how long before the manager's start a container must
// have started to count as one that ran across an agent restart.
const kubeletRestartGrace = 10 * time.Second

// UpdatePodStatus sets Started and Ready of every container status in st from the
// cached results, as the kubelet's prober manager does before a status is
// written: a container is started once its startup probe succeeded (or it has
// none), ready when running, started and its readiness result is Success (or it
// has no readiness probe). A readiness worker that has no result yet is asked
// to probe now. Non-sidecar init containers are ready when they exited 0.
func (m *Manager) UpdatePodStatus(pod *corev1.Pod, st *corev1.PodStatus) {
	for i := range st.ContainerStatuses {
		cs := &st.ContainerStatuses[i]
		var spec *corev1.Container
		for j := range pod.Spec.Containers {
			if pod.Spec.Containers[j].Name == cs.Name {
				spec = &pod.Spec.Containers[j]
			}
		}
		m.updateContainerStatus(pod, cs, spec)
	}
	for i := range st.InitContainerStatuses {
		cs := &st.InitContainerStatuses[i]
		started := m.isStarted(pod, cs)
		cs.Started = &started
		var spec *corev1.Container
		for j := range pod.Spec.InitContainers {
			if pod.Spec.InitContainers[j].Name == cs.Name {
				spec = &pod.Spec.InitContainers[j]
			}
		}
		if spec == nil {
			continue
		}
		if !restartableInit(spec) {
			if cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0 {
				cs.Ready = true
			}
			continue
		}
		m.updateContainerStatus(pod, cs, spec)
	}
}

func (m *Manager) updateContainerStatus(pod *corev1.Pod, cs *corev1.ContainerStatus, spec *corev1.Container) {
	started := m.isStarted(pod, cs)
	cs.Started = &started
	if !started {
		return
	}
	var ready bool
	if cs.State.Running == nil {
		ready = false
	} else if r, ok := m.results[Readiness].get(cs.ContainerID); ok && r == Success {
		ready = true
	} else {
		w, exists := m.worker(workerKey{pod.UID, cs.Name, Readiness})
		ready = !exists
		if exists {
			w.trigger()
		}
		if spec != nil {
			m.readyAcrossRestart(&ready, pod, cs, spec)
		}
	}
	cs.Ready = ready
}

func (m *Manager) isStarted(pod *corev1.Pod, cs *corev1.ContainerStatus) bool {
	if cs.State.Running == nil {
		return false
	}
	if r, ok := m.results[Startup].get(cs.ContainerID); ok {
		return r == Success
	}
	if cs.Started != nil && *cs.Started {
		return true
	}
	_, exists := m.worker(workerKey{pod.UID, cs.Name, Startup})
	return !exists
}

// readyAcrossRestart keeps a container that was running before the manager
// started from flapping: with no readiness result yet it stays ready, unless it has
// a readiness probe and the pod was not Ready.
func (m *Manager) readyAcrossRestart(ready *bool, pod *corev1.Pod, cs *corev1.ContainerStatus, spec *corev1.Container) {
	if cs.State.Running == nil {
		return
	}
	startedAt := cs.State.Running.StartedAt.Time
	if startedAt.IsZero() || !startedAt.Before(m.start.Add(-kubeletRestartGrace)) {
		return
	}
	if !*ready {
		if _, ok := m.results[Readiness].get(cs.ContainerID); !ok {
			*ready = true
		}
	}
	if spec.ReadinessProbe != nil {
		podReady := false
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				podReady = true
			}
		}
		if !podReady {
			*ready = false
		}
	}
}

type resultCache struct {
	mu sync.RWMutex
	m  map[string]Kind
}

func (c *resultCache) get(id string) (Kind, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.m[id]
	return r, ok
}

func (c *resultCache) set(id string, r Kind) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[id]; ok && prev == r {
		return false
	}
	c.m[id] = r
	return true
}

func (c *resultCache) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

type noopEvents struct{}

func (noopEvents) Event(*corev1.Pod, string, string, string, string) {}

// logger returns the manager's logger from ctx.
func logger(ctx context.Context) logr.Logger { return logr.FromContextOrDiscard(ctx) }
