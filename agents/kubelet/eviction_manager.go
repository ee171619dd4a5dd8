package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/clock"
)

// The kubelet's eviction timings: the monitoring interval (its housekeeping
// period) and how long it waits for an evicted pod to be cleaned up before it
// goes on.
const (
	evictionMonitoringInterval = 10 * time.Second
	podCleanupTimeout          = 30 * time.Second
)

var (
	evictionsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "kubelet", Name: "evictions",
		Help:           "Cumulative number of pod evictions by eviction signal",
		StabilityLevel: metrics.ALPHA,
	}, []string{"eviction_signal"})
	evictionStatsAge = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: "kubelet", Name: "eviction_stats_age_seconds",
		Help:           "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
		Buckets:        metrics.DefBuckets,
		StabilityLevel: metrics.ALPHA,
	}, []string{"eviction_signal"})
	registerEvictionMetricsOnce sync.Once
)

// evictionStats is where the manager reads the node and its pods.
type evictionStats interface {
	// summary is the stats summary with what the eviction signals need: the node's
	// memory, file systems and rlimit, the "pods" system container's memory, and
	// per pod the containers' memory and disk and the volumes' usage.
	summary(ctx context.Context, pods []*corev1.Pod) (*statsapi.Summary, error)
	// dedicatedImageFs says whether the runtime's images live on another file
	// system than the kubelet's root dir.
	dedicatedImageFs(ctx context.Context) (bool, error)
}

// evictionPods is what the manager needs from the pod workers.
type evictionPods interface {
	// evictionCandidates are the active pods: admitted, not terminal, not being
	// evicted or deleted.
	evictionCandidates() []*corev1.Pod
	// evictPod asks the pod's worker to kill it with the grace given and to finish
	// it with the status apply makes; done is closed once the pod is killed and
	// its volumes and cgroup reclaimed. ok is false for a pod the node does not
	// run.
	evictPod(pod *corev1.Pod, grace int64, apply func(*corev1.PodStatus)) (done <-chan struct{}, ok bool)
}

// evictionManager is the kubelet's eviction manager: every monitoring interval it
// observes the signals, keeps the pressure conditions, evicts pods over their
// local storage limits, and, when a threshold is met past its grace period,
// evicts the first ranked pod. It also admits pods against the pressure
// conditions.
type evictionManager struct {
	cfg      evictionConfig
	clock    clock.WithTicker
	stats    evictionStats
	pods     evictionPods
	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference
	interval time.Duration

	mu    sync.RWMutex
	state evictionState
	// dedicated is learned once, on the first round that can read it.
	dedicated *bool
}

// newEvictionConfig parses the KubeletConfiguration's eviction fields.
func newEvictionConfig(c *kubeletv1beta1.KubeletConfiguration) (evictionConfig, error) {
	enforce := c.EnforceNodeAllocatable
	if enforce == nil {
		enforce = []string{"pods"}
	}
	ts, err := parseEvictionConfig(c.EvictionHard, c.EvictionSoft, c.EvictionSoftGracePeriod, c.EvictionMinimumReclaim, enforce)
	if err != nil {
		return evictionConfig{}, err
	}
	localStorage := true
	if c.LocalStorageCapacityIsolation != nil {
		localStorage = *c.LocalStorageCapacityIsolation
	}
	return evictionConfig{
		thresholds:               ts,
		pressureTransitionPeriod: c.EvictionPressureTransitionPeriod.Duration,
		maxPodGracePeriod:        int64(c.EvictionMaxPodGracePeriod),
		localStorage:             localStorage,
	}, nil
}

func newEvictionManager(cfg evictionConfig, clk clock.WithTicker, recorder record.EventRecorder, nodeRef *corev1.ObjectReference) *evictionManager {
	registerEvictionMetricsOnce.Do(func() { legacyregistry.MustRegister(evictionsTotal, evictionStatsAge) })
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &evictionManager{cfg: cfg, clock: clk, recorder: recorder, nodeRef: nodeRef, interval: evictionMonitoringInterval}
}

// conditions are the pressure conditions the manager reports now.
func (m *evictionManager) conditions() []corev1.NodeConditionType {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]corev1.NodeConditionType(nil), m.state.conditions...)
}

// pressures are the node status's MemoryPressure, DiskPressure and PIDPressure,
// as the kubelet's setters read them from its eviction manager.
func (m *evictionManager) pressures() pressures {
	var p pressures
	for _, c := range m.conditions() {
		switch c {
		case corev1.NodeMemoryPressure:
			p.memory = true
		case corev1.NodeDiskPressure:
			p.disk = true
		case corev1.NodePIDPressure:
			p.pid = true
		}
	}
	return p
}

// admit is the eviction admit handler.
func (m *evictionManager) admit(pod *corev1.Pod) (reason, message string, ok bool) {
	return evictionAdmit(m.conditions(), pod)
}

// run monitors until ctx ends. After an eviction it waits (up to
// podCleanupTimeout) for the pod to be cleaned up, so the next round sees what
// the eviction reclaimed.
func (m *evictionManager) run(ctx context.Context) {
	klog.InfoS("Eviction manager: starting control loop")
	for {
		if ctx.Err() != nil {
			return
		}
		evicted := m.synchronize(ctx)
		if len(evicted) > 0 {
			m.waitForCleanup(ctx, evicted)
			continue
		}
		t := m.clock.NewTimer(m.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// evictedPod is a pod evicted in a round and what closes when it is cleaned up.
type evictedPod struct {
	pod  *corev1.Pod
	done <-chan struct{}
}

func (m *evictionManager) waitForCleanup(ctx context.Context, pods []evictedPod) {
	t := m.clock.NewTimer(podCleanupTimeout)
	defer t.Stop()
	for _, p := range pods {
		if p.done == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			klog.InfoS("Eviction manager: timed out waiting for pods to be cleaned up", "pods", klog.KObj(p.pod))
			return
		case <-p.done:
		}
	}
	klog.InfoS("Eviction manager: pods successfully cleaned up", "pods", podRefs(pods))
}

func podRefs(pods []evictedPod) []klog.ObjectRef {
	out := make([]klog.ObjectRef, 0, len(pods))
	for _, p := range pods {
		out = append(out, klog.KObj(p.pod))
	}
	return out
}

// synchronize is one monitoring round, in the kubelet's order; it returns the
// pods it evicted (at most one for a threshold, any number over their local
// storage limits).
func (m *evictionManager) synchronize(ctx context.Context) []evictedPod {
	if len(m.cfg.thresholds) == 0 && !m.cfg.localStorage {
		return nil
	}
	if m.dedicated == nil {
		d, err := m.stats.dedicatedImageFs(ctx)
		if err != nil {
			klog.ErrorS(err, "Eviction manager: failed to get HasDedicatedImageFs")
			return nil
		}
		m.dedicated = &d
		m.cfg.thresholds = withContainerFsThresholds(m.cfg.thresholds, d)
	}
	active := m.pods.evictionCandidates()
	summary, err := m.stats.summary(ctx, active)
	if err != nil {
		klog.ErrorS(err, "Eviction manager: failed to get summary stats")
		return nil
	}
	obs := makeObservations(summary)
	now := m.clock.Now()
	m.mu.Lock()
	thresholds := m.state.step(m.cfg, obs, now)
	conditions := append([]corev1.NodeConditionType(nil), m.state.conditions...)
	m.mu.Unlock()
	if len(conditions) > 0 {
		klog.V(3).InfoS("Eviction manager: node conditions - observed", "nodeCondition", conditions)
	}
	stats := statsByUID(summary.Pods)

	if m.cfg.localStorage {
		var evicted []evictedPod
		for _, pod := range active {
			ps, ok := stats(pod)
			if !ok {
				continue
			}
			msg, signal, violated := localStorageViolation(pod, ps, *m.dedicated)
			if !violated {
				continue
			}
			if done, ok := m.evict(pod, immediateEvictionGracePeriodSeconds, msg, nil, nil); ok {
				evictionsTotal.WithLabelValues(signal).Inc()
				evicted = append(evicted, evictedPod{pod: pod, done: done})
			}
		}
		if len(evicted) > 0 {
			return evicted
		}
	}

	if len(thresholds) == 0 {
		klog.V(3).InfoS("Eviction manager: no resources are starved")
		return nil
	}
	target, res, ok := reclaimTarget(thresholds)
	if !ok {
		return nil
	}
	klog.InfoS("Eviction manager: attempting to reclaim", "resourceName", res)
	if m.recorder != nil && m.nodeRef != nil {
		m.recorder.Eventf(m.nodeRef, corev1.EventTypeWarning, "EvictionThresholdMet", "Attempting to reclaim %s", res)
	}
	// The kubelet first tries container and image garbage collection for disk
	// signals; nodekit's kubelet has none to call yet, so it goes to pods.
	klog.InfoS("Eviction manager: must evict pod(s) to reclaim", "resourceName", res)
	rank, ok := rankFuncFor(target.signal, *m.dedicated)
	if !ok {
		klog.ErrorS(nil, "Eviction manager: no ranking function for signal", "threshold", target.signal)
		return nil
	}
	if len(active) == 0 {
		klog.ErrorS(nil, "Eviction manager: eviction thresholds have been met, but no pods are active to evict")
		return nil
	}
	rank(active, stats)
	klog.InfoS("Eviction manager: pods ranked for eviction", "pods", klog.KObjSlice(active))
	for _, t := range thresholds {
		if at := obs[t.signal].time; !at.IsZero() {
			evictionStatsAge.WithLabelValues(string(t.signal)).Observe(m.clock.Since(at).Seconds())
		}
	}
	for _, pod := range active {
		grace := int64(immediateEvictionGracePeriodSeconds)
		if !target.hard() {
			grace = m.cfg.maxPodGracePeriod
			if pod.Spec.TerminationGracePeriodSeconds != nil {
				grace = min(grace, *pod.Spec.TerminationGracePeriodSeconds)
			}
		}
		msg, annotations := evictionMessage(res, pod, stats, thresholds, obs)
		cond := &corev1.PodCondition{
			Type:               corev1.DisruptionTarget,
			Status:             corev1.ConditionTrue,
			Reason:             corev1.PodReasonTerminationByKubelet,
			Message:            msg,
			ObservedGeneration: pod.Generation,
			LastTransitionTime: metav1.NewTime(now),
		}
		if done, ok := m.evict(pod, grace, msg, annotations, cond); ok {
			evictionsTotal.WithLabelValues(string(target.signal)).Inc()
			return []evictedPod{{pod: pod, done: done}}
		}
	}
	klog.InfoS("Eviction manager: unable to evict any pods from the node")
	return nil
}

// evict records the Evicted event (with the annotations naming the offending
// containers, for a threshold eviction) and hands the pod to its worker, unless it is
// critical. ok is true when the eviction was asked for, as the kubelet counts
// an eviction whose kill failed.
func (m *evictionManager) evict(pod *corev1.Pod, grace int64, msg string, annotations map[string]string, cond *corev1.PodCondition) (<-chan struct{}, bool) {
	if isCriticalPod(pod) {
		klog.ErrorS(nil, "Eviction manager: cannot evict a critical pod", "pod", klog.KObj(pod))
		return nil, false
	}
	if m.recorder != nil {
		m.recorder.AnnotatedEventf(pod, annotations, corev1.EventTypeWarning, evictionReason, "%s", msg)
	}
	klog.V(3).InfoS("Evicting pod", "pod", klog.KObj(pod), "podUID", pod.UID, "message", msg)
	done, ok := m.pods.evictPod(pod, grace, evictedStatus(msg, cond))
	if !ok {
		klog.ErrorS(fmt.Errorf("pod %s is not running on this node", podDesc(pod)), "Eviction manager: pod failed to evict", "pod", klog.KObj(pod))
		return nil, true
	}
	klog.InfoS("Eviction manager: pod is evicted successfully", "pod", klog.KObj(pod))
	return done, true
}

// evictedStatus is what an eviction does to the pod's final status: phase
// Failed, reason Evicted, the message, and for a threshold eviction the
// DisruptionTarget condition.
func evictedStatus(msg string, cond *corev1.PodCondition) func(*corev1.PodStatus) {
	return func(st *corev1.PodStatus) {
		st.Phase = corev1.PodFailed
		st.Reason = evictionReason
		st.Message = msg
		if cond == nil {
			return
		}
		for i := range st.Conditions {
			if st.Conditions[i].Type == cond.Type {
				st.Conditions[i] = *cond.DeepCopy()
				return
			}
		}
		st.Conditions = append(st.Conditions, *cond.DeepCopy())
	}
}
