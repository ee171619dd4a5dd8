package probe

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
)

// worker probes one container with one probe type until stopped.
type worker struct {
	m         *Manager
	key       workerKey
	typ       Type
	pod       atomic.Pointer[corev1.Pod]
	container corev1.Container
	spec      *corev1.Probe
	initial   Kind
	labels    MetricLabels

	stopCh    chan struct{}
	triggerCh chan struct{}

	// Owned by the worker goroutine.
	log         logr.Logger
	containerID string
	lastResult  Kind
	resultRun   int
	onHold      bool
}

func newWorker(m *Manager, t Type, pod *corev1.Pod, c corev1.Container, spec *corev1.Probe) *worker {
	w := &worker{
		m:         m,
		key:       workerKey{pod.UID, c.Name, t},
		typ:       t,
		container: c,
		spec:      spec,
		stopCh:    make(chan struct{}, 1),
		triggerCh: make(chan struct{}, 1),
		labels: MetricLabels{
			ProbeType: t.String(),
			Container: c.Name,
			Pod:       pod.Name,
			Namespace: pod.Namespace,
			PodUID:    pod.UID,
		},
	}
	w.pod.Store(pod)
	switch t {
	case Readiness:
		w.initial = Failure
	case Liveness:
		w.initial = Success
	default:
		w.initial = Unknown
	}
	return w
}

func (w *worker) setPod(p *corev1.Pod) { w.pod.Store(p) }

// stop asks the worker to end; safe to call many times.
func (w *worker) stop() {
	select {
	case w.stopCh <- struct{}{}:
	default:
	}
}

// trigger asks for a probe now; the period restarts from it.
func (w *worker) trigger() {
	select {
	case w.triggerCh <- struct{}{}:
	default:
	}
}

func (w *worker) run(ctx context.Context) {
	m := w.m
	w.log = logger(ctx).WithValues("probeType", w.typ.String(), "pod", w.labels.Namespace+"/"+w.labels.Pod, "podUID", w.key.podUID, "containerName", w.container.Name)
	period := time.Duration(w.spec.PeriodSeconds) * time.Second
	defer func() {
		if w.containerID != "" {
			m.results[w.typ].remove(w.containerID)
		}
		m.removeWorker(w)
		m.metrics.WorkerGone(w.labels)
	}()

	if !w.firstDelay(ctx, period) {
		return
	}
	idle := func() {
		if m.probed != nil {
			m.probed(w.key)
		}
	}
	if !w.doProbe(ctx) {
		idle()
		return
	}
	if !w.sleep(ctx, m.toGrid()) {
		return
	}
	ticker := m.clock.NewTicker(period)
	defer func() { ticker.Stop() }()
	for {
		idle() // the round is done and the worker waits for its next tick
		realign := false
		select {
		case <-w.stopCh:
			return
		case <-ctx.Done():
			return
		case <-ticker.C():
		case <-w.triggerCh:
			// A manual run restarts the period from now, as upstream; with
			// coalescing on, the new ticker starts on the grid after the probe.
			ticker.Stop()
			if m.grid > 0 {
				realign = true
			} else {
				ticker = m.clock.NewTicker(period)
			}
		}
		if !w.doProbe(ctx) {
			idle()
			return
		}
		if realign {
			if !w.sleep(ctx, m.toGrid()) {
				return
			}
			ticker = m.clock.NewTicker(period)
		}
	}
}

// sleep waits d on the clock; it reports false when the worker was stopped.
//
//go:noinline
func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := w.m.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-w.stopCh:
		return false
	case <-ctx.Done():
		return false
	}
}

// firstDelay waits a random part of the period when the manager started less
// than a period ago, so a restarted agent does not probe everything at once. It
// reports false when the worker was stopped meanwhile.
//
//go:noinline
func (w *worker) firstDelay(ctx context.Context, period time.Duration) bool {
	m := w.m
	if period <= m.clock.Since(m.start) {
		return true
	}
	d := time.Duration(m.rand() * float64(period))
	if m.grid > 0 {
		// End the wait on the grid, so the ticker that follows is aligned too.
		end := m.clock.Now().Add(d).UnixNano()
		if r := end % int64(m.grid); r != 0 {
			d += time.Duration(int64(m.grid) - r)
		}
	}
	return w.sleep(ctx, d)
}

// doProbe runs one round; it reports whether the worker should keep going.
func (w *worker) doProbe(ctx context.Context) bool {
	m := w.m
	log := w.log
	start := m.clock.Now()
	pod := w.pod.Load()

	st, ok := m.status.PodStatus(w.key.podUID)
	if !ok || st == nil {
		log.V(4).Info("No status for pod")
		return true
	}
	if st.Phase == corev1.PodFailed || st.Phase == corev1.PodSucceeded {
		log.V(4).Info("Pod is terminated, exiting probe worker", "phase", st.Phase)
		return false
	}
	cs, ok := findStatus(st.ContainerStatuses, w.container.Name)
	if !ok || cs.ContainerID == "" {
		cs, ok = findStatus(st.InitContainerStatuses, w.container.Name)
		if !ok || cs.ContainerID == "" {
			log.V(4).Info("Probe target container not found")
			return true
		}
	}
	sidecar := restartableInit(&w.container) && isInitContainer(pod, w.container.Name)

	if w.containerID != cs.ContainerID {
		if w.containerID != "" {
			m.results[w.typ].remove(w.containerID)
		}
		w.containerID = cs.ContainerID
		// A container already running well before the manager started (an agent
		// restart) keeps its previous state instead of the initial value.
		restarted := false
		if cs.State.Running != nil {
			t := cs.State.Running.StartedAt.Time
			restarted = !t.IsZero() && t.Before(m.start.Add(-kubeletRestartGrace))
		}
		if sidecar && w.typ == Startup && cs.Started != nil && *cs.Started {
			m.setResult(ctx, w.typ, w.containerID, Success, w.key.podUID)
		}
		if !restarted {
			m.setResult(ctx, w.typ, w.containerID, w.initial, w.key.podUID)
		}
		w.onHold = false
	}
	if w.onHold {
		return true
	}

	if cs.State.Running == nil {
		log.V(4).Info("Non-running container probed")
		m.setResult(ctx, w.typ, w.containerID, Failure, w.key.podUID)
		if cs.State.Terminated == nil {
			return true
		}
		return shouldRestart(&w.container, pod, st, cs.State.Terminated.ExitCode)
	}

	if pod.DeletionTimestamp != nil && (w.typ == Liveness || w.typ == Startup) {
		log.V(4).Info("Pod deletion requested, setting probe result to success")
		m.setResult(ctx, w.typ, w.containerID, Success, w.key.podUID)
		return false
	}

	if int32(m.clock.Since(cs.State.Running.StartedAt.Time).Seconds()) < w.spec.InitialDelaySeconds {
		return true
	}

	if cs.Started != nil && *cs.Started {
		if w.typ == Startup {
			return true
		}
	} else if w.typ != Startup {
		return true
	}

	res, err := m.prober.Probe(ctx, w.spec, Target{Host: st.PodIP, Container: &w.container, ContainerID: runtimeID(w.containerID)})
	w.record(ctx, pod, res, err, start)
	return true
}

// record applies one probe result: events, metrics, thresholds and the hold.
// It is separate from doProbe to keep the worker's stack small between rounds.
//
//go:noinline
func (w *worker) record(ctx context.Context, pod *corev1.Pod, res Result, err error, start time.Time) {
	m := w.m
	log := w.log
	var kept Kind
	switch {
	case err != nil:
		log.V(1).Info("Probe errored", "probeResult", res.Kind, "err", err)
		m.events.Event(pod, w.container.Name, corev1.EventTypeWarning, "Unhealthy",
			fmt.Sprintf("%s probe errored and resulted in %s state: %s", w.typ, res.Kind, err))
		return // the result is thrown away
	case res.Kind == Success:
		kept = Success
	case res.Kind == Warning:
		m.events.Event(pod, w.container.Name, corev1.EventTypeWarning, "ProbeWarning",
			fmt.Sprintf("%s probe warning: %s", w.typ, res.Message))
		kept = Success
	case res.Kind == Failure:
		log.V(1).Info("Probe failed", "output", res.Message)
		m.events.Event(pod, w.container.Name, corev1.EventTypeWarning, "Unhealthy",
			fmt.Sprintf("%s probe failed: %s", w.typ, res.Message))
		kept = Failure
	default:
		kept = Failure
	}

	switch kept {
	case Success:
		m.metrics.ProbeCounted(w.labels, MetricResultSuccessful)
		m.metrics.ProbeDuration(w.labels, m.clock.Since(start))
	case Failure:
		m.metrics.ProbeCounted(w.labels, MetricResultFailed)
	}

	if w.lastResult == kept {
		w.resultRun++
	} else {
		w.lastResult = kept
		w.resultRun = 1
	}
	if (kept == Failure && w.resultRun < int(w.spec.FailureThreshold)) ||
		(kept == Success && w.resultRun < int(w.spec.SuccessThreshold)) {
		return
	}
	m.setResult(ctx, w.typ, w.containerID, kept, w.key.podUID)
	if (w.typ == Liveness && kept == Failure) || w.typ == Startup {
		// The container will be restarted (liveness/startup failure) or has started
		// (startup success): hold until a new container ID shows up.
		w.onHold = true
		w.resultRun = 0
	}
}

func findStatus(list []corev1.ContainerStatus, name string) (*corev1.ContainerStatus, bool) {
	for i := range list {
		if list[i].Name == name {
			return &list[i], true
		}
	}
	return nil, false
}

func isInitContainer(pod *corev1.Pod, name string) bool {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return true
		}
	}
	return false
}

// runtimeID strips the "<runtime>://" prefix of a status container ID: the
// Execer gets the bare ID, as CRI ExecSync does.
func runtimeID(id string) string {
	if i := strings.Index(id, "://"); i >= 0 {
		return id[i+3:]
	}
	return id
}

// shouldRestart says whether a terminated container will be restarted, from its
// restart rules, its own restart policy and the pod's, as the kubelet decides with
// ContainerRestartRules on (the 1.37 default). A pod whose AllContainersRestarting
// condition is True also keeps its workers.
func shouldRestart(c *corev1.Container, pod *corev1.Pod, st *corev1.PodStatus, exitCode int32) bool {
	for _, cond := range st.Conditions {
		if cond.Type == corev1.AllContainersRestarting && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	if c.RestartPolicy != nil {
		for _, rule := range c.RestartPolicyRules {
			if rule.ExitCodes == nil {
				continue
			}
			matched := false
			for _, v := range rule.ExitCodes.Values {
				if v == exitCode {
					matched = true
				}
			}
			hit := (rule.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn && matched) ||
				(rule.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpNotIn && !matched)
			if !hit {
				continue
			}
			if rule.Action == corev1.ContainerRestartRuleActionRestart || rule.Action == corev1.ContainerRestartRuleActionRestartAllContainers {
				return true
			}
			break
		}
		switch *c.RestartPolicy {
		case corev1.ContainerRestartPolicyAlways:
			return true
		case corev1.ContainerRestartPolicyOnFailure:
			return exitCode != 0
		case corev1.ContainerRestartPolicyNever:
			return false
		}
	}
	switch pod.Spec.RestartPolicy {
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	case corev1.RestartPolicyNever:
		return false
	default:
		return true
	}
}
