package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/component-base/metrics"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// SummaryHandler serves GET (and POST, as the kubelet accepts) /stats/summary:
// the Summary as indented JSON, trimmed to CPU and memory when the query has
// only_cpu_and_memory=true exactly once. Errors are 500 "Internal Error: ...".
func (p *Provider) SummaryHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodPost {
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, "405: Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		if err := r.ParseForm(); err != nil {
			summaryError(w, r, fmt.Errorf("parse form failed: %w", err))
			return
		}
		only := r.Form["only_cpu_and_memory"]
		var s *statsapi.Summary
		var err error
		if len(only) == 1 && only[0] == "true" {
			s, err = p.CPUAndMemory(r.Context())
		} else {
			s, err = p.Summary(r.Context())
		}
		if err != nil {
			summaryError(w, r, err)
			return
		}
		// go-restful, which serves the kubelet's, indents with one space.
		b, err := json.MarshalIndent(s, "", " ")
		if err != nil {
			summaryError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
	})
}

func summaryError(w http.ResponseWriter, r *http.Request, err error) {
	msg := fmt.Sprintf("Internal Error: %v", err)
	logr.FromContextOrDiscard(r.Context()).Error(err, "HTTP InternalServerError serving /stats/summary")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = w.Write([]byte(msg))
}

// ResourceMetricsHandler serves /metrics/resource in the Prometheus text format,
// with the kubelet's metric names, help, labels and sample timestamps. Scrapes run
// one at a time, each under its request's context.
func (p *Provider) ResourceMetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.metrics.mu.Lock()
		defer p.metrics.mu.Unlock()
		p.metrics.ctx = r.Context()
		defer func() { p.metrics.ctx = nil }()
		p.metrics.handler.ServeHTTP(w, r)
	})
}

// The descriptors of upstream's pkg/kubelet/metrics/collectors/resource_metrics.go.
// scrape_error (ALPHA, deprecated in 1.29) is hidden by component-base from 1.30
// on, so a 1.37 kubelet does not serve it and neither does this one; the registry
// here carries no build version to hide it by, so it is left out.
var (
	nodeCPUUsageDesc = metrics.NewDesc("node_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the node in core-seconds", nil, nil, metrics.STABLE, "")
	nodeMemoryUsageDesc = metrics.NewDesc("node_memory_working_set_bytes",
		"Current working set of the node in bytes", nil, nil, metrics.STABLE, "")
	nodeSwapUsageDesc = metrics.NewDesc("node_swap_usage_bytes",
		"Current swap usage of the node in bytes. Reported only on non-windows systems", nil, nil, metrics.ALPHA, "")
	containerCPUUsageDesc = metrics.NewDesc("container_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the container in core-seconds", containerLabels, nil, metrics.STABLE, "")
	containerMemoryUsageDesc = metrics.NewDesc("container_memory_working_set_bytes",
		"Current working set of the container in bytes", containerLabels, nil, metrics.STABLE, "")
	containerSwapUsageDesc = metrics.NewDesc("container_swap_usage_bytes",
		"Current amount of the container swap usage in bytes. Reported only on non-windows systems", containerLabels, nil, metrics.ALPHA, "")
	containerSwapLimitDesc = metrics.NewDesc("container_swap_limit_bytes",
		"Current amount of the container swap limit in bytes. Reported only on non-windows systems", containerLabels, nil, metrics.ALPHA, "")
	podCPUUsageDesc = metrics.NewDesc("pod_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the pod in core-seconds", podLabels, nil, metrics.STABLE, "")
	podMemoryUsageDesc = metrics.NewDesc("pod_memory_working_set_bytes",
		"Current working set of the pod in bytes", podLabels, nil, metrics.STABLE, "")
	podSwapUsageDesc = metrics.NewDesc("pod_swap_usage_bytes",
		"Current amount of the pod swap usage in bytes. Reported only on non-windows systems", podLabels, nil, metrics.ALPHA, "")
	resourceScrapeErrorDesc = metrics.NewDesc("resource_scrape_error",
		"1 if there was an error while getting container metrics, 0 otherwise", nil, nil, metrics.STABLE, "")
	containerStartTimeDesc = metrics.NewDesc("container_start_time_seconds",
		"Start time of the container since unix epoch in seconds", containerLabels, nil, metrics.STABLE, "")

	containerLabels = []string{"container", "pod", "namespace"}
	podLabels       = []string{"pod", "namespace"}
)

// resourceMetrics is the stable collector behind /metrics/resource, in its own
// registry as the kubelet's.
type resourceMetrics struct {
	metrics.BaseStableCollector
	p       *Provider
	handler http.Handler

	mu  sync.Mutex      // one scrape at a time
	ctx context.Context // the scrape's request context, set under mu
}

func newResourceMetrics(p *Provider) *resourceMetrics {
	rm := &resourceMetrics{p: p}
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(rm)
	rm.handler = metrics.HandlerFor(reg, metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError})
	return rm
}

// DescribeWithStability implements metrics.StableCollector.
func (rm *resourceMetrics) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{nodeCPUUsageDesc, nodeMemoryUsageDesc, nodeSwapUsageDesc,
		containerStartTimeDesc, containerCPUUsageDesc, containerMemoryUsageDesc, containerSwapUsageDesc,
		containerSwapLimitDesc, podCPUUsageDesc, podMemoryUsageDesc, podSwapUsageDesc, resourceScrapeErrorDesc} {
		ch <- d
	}
}

// CollectWithStability implements metrics.StableCollector: one sample per live
// container and pod, so series of removed ones disappear with them.
func (rm *resourceMetrics) CollectWithStability(ch chan<- metrics.Metric) {
	ctx := rm.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	s, err := rm.p.CPUAndMemory(ctx)
	if err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "Error getting summary for resourceMetric prometheus endpoint")
		ch <- metrics.NewLazyConstMetric(resourceScrapeErrorDesc, metrics.GaugeValue, 1)
		return
	}
	node := s.Node
	if node.CPU != nil && node.CPU.UsageCoreNanoSeconds != nil {
		ch <- stamped(node.CPU.Time.Time, nodeCPUUsageDesc, metrics.CounterValue, seconds(*node.CPU.UsageCoreNanoSeconds))
	}
	if node.Memory != nil && node.Memory.WorkingSetBytes != nil {
		ch <- stamped(node.Memory.Time.Time, nodeMemoryUsageDesc, metrics.GaugeValue, float64(*node.Memory.WorkingSetBytes))
	}
	if node.Swap != nil && node.Swap.SwapUsageBytes != nil && node.Memory != nil {
		// Upstream stamps the node's swap with its memory time.
		ch <- stamped(node.Memory.Time.Time, nodeSwapUsageDesc, metrics.GaugeValue, float64(*node.Swap.SwapUsageBytes))
	}
	for _, pod := range s.Pods {
		name, ns := pod.PodRef.Name, pod.PodRef.Namespace
		for _, c := range pod.Containers {
			if c.StartTime.Unix() > 0 {
				ch <- metrics.NewLazyConstMetric(containerStartTimeDesc, metrics.GaugeValue,
					float64(c.StartTime.UnixNano())/float64(time.Second), c.Name, name, ns)
			}
			if c.CPU != nil && c.CPU.UsageCoreNanoSeconds != nil {
				ch <- stamped(c.CPU.Time.Time, containerCPUUsageDesc, metrics.CounterValue, seconds(*c.CPU.UsageCoreNanoSeconds), c.Name, name, ns)
			}
			if c.Memory != nil && c.Memory.WorkingSetBytes != nil {
				ch <- stamped(c.Memory.Time.Time, containerMemoryUsageDesc, metrics.GaugeValue, float64(*c.Memory.WorkingSetBytes), c.Name, name, ns)
			}
			if c.Swap != nil {
				if c.Swap.SwapUsageBytes != nil {
					ch <- stamped(c.Swap.Time.Time, containerSwapUsageDesc, metrics.GaugeValue, float64(*c.Swap.SwapUsageBytes), c.Name, name, ns)
				}
				if c.Swap.SwapAvailableBytes != nil {
					limit := float64(*c.Swap.SwapAvailableBytes) + float64(deref(c.Swap.SwapUsageBytes))
					ch <- stamped(c.Swap.Time.Time, containerSwapLimitDesc, metrics.GaugeValue, limit, c.Name, name, ns)
				}
			}
		}
		if pod.CPU != nil && pod.CPU.UsageCoreNanoSeconds != nil {
			ch <- stamped(pod.CPU.Time.Time, podCPUUsageDesc, metrics.CounterValue, seconds(*pod.CPU.UsageCoreNanoSeconds), name, ns)
		}
		if pod.Memory != nil && pod.Memory.WorkingSetBytes != nil {
			ch <- stamped(pod.Memory.Time.Time, podMemoryUsageDesc, metrics.GaugeValue, float64(*pod.Memory.WorkingSetBytes), name, ns)
		}
		if pod.Swap != nil && pod.Swap.SwapUsageBytes != nil {
			ch <- stamped(pod.Swap.Time.Time, podSwapUsageDesc, metrics.GaugeValue, float64(*pod.Swap.SwapUsageBytes), name, ns)
		}
	}
	ch <- metrics.NewLazyConstMetric(resourceScrapeErrorDesc, metrics.GaugeValue, 0)
}

func stamped(t time.Time, d *metrics.Desc, vt metrics.ValueType, v float64, labels ...string) metrics.Metric {
	return metrics.NewLazyMetricWithTimestamp(t, metrics.NewLazyConstMetric(d, vt, v, labels...))
}

func seconds(ns uint64) float64 { return float64(ns) / float64(time.Second) }
