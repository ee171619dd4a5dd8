package probe

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Values of the result label of prober_probe_total.
const (
	MetricResultSuccessful = "successful"
	MetricResultFailed     = "failed"
	MetricResultUnknown    = "unknown"
)

// MetricLabels identify one worker's series. prober_probe_total carries all of
// them plus result; prober_probe_duration_seconds carries all but PodUID.
type MetricLabels struct {
	ProbeType string // "Liveness", "Readiness" or "Startup"
	Container string
	Pod       string
	Namespace string
	PodUID    types.UID
}

// Metrics receives what the kubelet exports as its prober metrics. Agents adapt
// it to Prometheus under the upstream names.
//
// Upstream meanings: prober_probe_total (counter, BETA) counts every probe whose
// result a worker kept, by result; a probe attempt that errored on every retry
// is not counted. prober_probe_duration_seconds (histogram, ALPHA) observes the
// time from the start of the worker's round (status lookup included) to the
// result, for successful and unknown results only; failed probes are not
// observed. When a worker ends its series are deleted.
type Metrics interface {
	// ProbeCounted adds one to prober_probe_total{labels, result}.
	ProbeCounted(labels MetricLabels, result string)
	// ProbeDuration observes prober_probe_duration_seconds{labels without PodUID}.
	ProbeDuration(labels MetricLabels, d time.Duration)
	// WorkerGone deletes the worker's series.
	WorkerGone(labels MetricLabels)
}

// NoopMetrics discards everything.
type NoopMetrics struct{}

// ProbeCounted does nothing.
func (NoopMetrics) ProbeCounted(MetricLabels, string) {}

// ProbeDuration does nothing.
func (NoopMetrics) ProbeDuration(MetricLabels, time.Duration) {}

// WorkerGone does nothing.
func (NoopMetrics) WorkerGone(MetricLabels) {}
