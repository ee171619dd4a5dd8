package main

import (
	"sync"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/nodekit-dev/nodekit/probe"
)

// The kubelet's metrics under their upstream names (pkg/kubelet/metrics,
// pkg/kubelet/prober), registered in component-base's legacy registry.
var (
	nodeName = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "kubelet", Name: "node_name",
		Help:           "The node's name. The count is always 1.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node"})
	runningPods = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "kubelet", Name: "running_pods",
		Help:           "Number of pods that have a running pod sandbox",
		StabilityLevel: metrics.ALPHA,
	})
	runningContainers = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "kubelet", Name: "running_containers",
		Help:           "Number of containers currently running",
		StabilityLevel: metrics.ALPHA,
	}, []string{"container_state"})
	podStartDuration = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: "kubelet", Name: "pod_start_duration_seconds",
		Help:           "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
		Buckets:        []float64{0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600},
		StabilityLevel: metrics.ALPHA,
	})
	podWorkerDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: "kubelet", Name: "pod_worker_duration_seconds",
		Help:           "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
		Buckets:        metrics.DefBuckets,
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation_type"})
	runtimeOperations = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "kubelet", Name: "runtime_operations_total",
		Help:           "Cumulative number of runtime operations by operation type.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation_type"})
	runtimeOperationsDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: "kubelet", Name: "runtime_operations_duration_seconds",
		Help:           "Duration in seconds of runtime operations. Broken down by operation type.",
		Buckets:        metrics.ExponentialBuckets(.005, 2.5, 14),
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation_type"})
	runtimeOperationsErrors = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "kubelet", Name: "runtime_operations_errors_total",
		Help:           "Cumulative number of runtime operation errors by operation type.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation_type"})
	proberProbeTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "prober", Name: "probe_total",
		Help:           "Cumulative number of a liveness, readiness or startup probe for a container by result.",
		StabilityLevel: metrics.BETA,
	}, []string{"probe_type", "result", "container", "pod", "namespace", "pod_uid"})
	proberProbeDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: "prober", Name: "probe_duration_seconds",
		Help:           "Duration in seconds for a probe response.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"probe_type", "container", "pod", "namespace"})
	imageGarbageCollected = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "kubelet", Name: "image_garbage_collected_total",
		Help:           "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
)

var registerMetricsOnce sync.Once

func registerMetrics() {
	registerMetricsOnce.Do(func() {
		legacyregistry.MustRegister(nodeName, runningPods, runningContainers, podStartDuration, podWorkerDuration,
			runtimeOperations, runtimeOperationsDuration, runtimeOperationsErrors, proberProbeTotal, proberProbeDuration,
			imageGarbageCollected)
	})
}

// criMetrics adapts cri.Metrics to the kubelet_runtime_operations_* series.
type criMetrics struct{}

func (criMetrics) RuntimeOperation(op string, d time.Duration, err error) {
	runtimeOperations.WithLabelValues(op).Inc()
	runtimeOperationsDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		runtimeOperationsErrors.WithLabelValues(op).Inc()
	}
}

// probeMetrics adapts probe.Metrics to prober_probe_total and prober_probe_duration_seconds.
type probeMetrics struct{}

func (probeMetrics) ProbeCounted(l probe.MetricLabels, result string) {
	proberProbeTotal.WithLabelValues(l.ProbeType, result, l.Container, l.Pod, l.Namespace, string(l.PodUID)).Inc()
}

func (probeMetrics) ProbeDuration(l probe.MetricLabels, d time.Duration) {
	proberProbeDuration.WithLabelValues(l.ProbeType, l.Container, l.Pod, l.Namespace).Observe(d.Seconds())
}

func (probeMetrics) WorkerGone(l probe.MetricLabels) {
	for _, r := range []string{probe.MetricResultSuccessful, probe.MetricResultFailed, probe.MetricResultUnknown} {
		proberProbeTotal.DeleteLabelValues(l.ProbeType, r, l.Container, l.Pod, l.Namespace, string(l.PodUID))
	}
	proberProbeDuration.DeleteLabelValues(l.ProbeType, l.Container, l.Pod, l.Namespace)
}
