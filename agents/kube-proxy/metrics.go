package main

import (
	"sync"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The metrics below carry upstream kube-proxy's names, help texts, labels and
// buckets (pkg/proxy/metrics/metrics.go, v1.37.2), so dashboards and alerts
// written for kube-proxy work unchanged. The nodekit_ ones have no upstream peer.
const subsystem = "kubeproxy"

var (
	syncProxyRulesLatency = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds",
		Buckets: metrics.ExponentialBuckets(0.001, 2, 15), StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	syncFullProxyRulesLatency = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "sync_full_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds for full resyncs",
		Buckets: metrics.ExponentialBuckets(0.001, 2, 15), StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	syncPartialProxyRulesLatency = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "sync_partial_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds for partial resyncs",
		Buckets: metrics.ExponentialBuckets(0.001, 2, 15), StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	syncProxyRulesLastTimestamp = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_last_timestamp_seconds",
		Help: "The last time proxy rules were successfully synced", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	syncProxyRulesLastQueuedTimestamp = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
		Help: "The last time a sync of proxy rules was queued", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	networkProgrammingLatency = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "network_programming_duration_seconds",
		Help: "In Cluster Network Programming Latency in seconds",
		Buckets: metrics.MergeBuckets(
			metrics.LinearBuckets(0.25, 0.25, 2),
			metrics.LinearBuckets(1, 1, 59),
			metrics.LinearBuckets(60, 5, 12),
			metrics.LinearBuckets(120, 30, 7),
		),
		StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	endpointChangesTotal = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total",
		Help: "Cumulative proxy rules Endpoint changes", StabilityLevel: metrics.ALPHA,
	})
	serviceChangesTotal = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total",
		Help: "Cumulative proxy rules Service changes", StabilityLevel: metrics.ALPHA,
	})
	serviceChangesPending = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending",
		Help: "Pending proxy rules Service changes", StabilityLevel: metrics.ALPHA,
	})
	noLocalEndpointsTotal = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_no_local_endpoints_total",
		Help: "Number of services with a Local traffic policy and no endpoints", StabilityLevel: metrics.ALPHA,
	}, []string{"traffic_policy", "ip_family"})
	iptablesRestoreFailuresTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
		Help: "Cumulative proxy iptables restore failures", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	nftablesSyncFailuresTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_nftables_sync_failures_total",
		Help: "Cumulative proxy nftables sync failures", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	proxyHealthzTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "proxy_healthz_total",
		Help: "Cumulative proxy healthz HTTP status", StabilityLevel: metrics.ALPHA,
	}, []string{"code"})
	proxyLivezTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "proxy_livez_total",
		Help: "Cumulative proxy livez HTTP status", StabilityLevel: metrics.ALPHA,
	}, []string{"code"})
	conntrackDeletedTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "conntrack_reconciler_deleted_entries_total",
		Help: "Cumulative conntrack flows deleted by conntrack reconciler", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})

	// nodekit's own: what it refused to write.
	invalidObjectsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "nodekit", Subsystem: subsystem, Name: "invalid_objects_total",
		Help: "Services and EndpointSlices skipped as unusable", StabilityLevel: metrics.ALPHA,
	}, []string{"kind"})
	skippedServicePorts = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace: "nodekit", Subsystem: subsystem, Name: "skipped_service_ports",
		Help: "Service ports left out of the last sync because the rules cannot express them", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
	skippedServicePortsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "nodekit", Subsystem: subsystem, Name: "skipped_service_ports_total",
		Help: "Service ports newly left out of a sync because the rules cannot express them", StabilityLevel: metrics.ALPHA,
	}, []string{"ip_family"})
)

var registerOnce sync.Once

func registerMetrics() {
	registerOnce.Do(func() {
		for _, c := range []metrics.Registerable{
			syncProxyRulesLatency, syncFullProxyRulesLatency, syncPartialProxyRulesLatency,
			syncProxyRulesLastTimestamp, syncProxyRulesLastQueuedTimestamp, networkProgrammingLatency,
			endpointChangesTotal, serviceChangesTotal, serviceChangesPending, noLocalEndpointsTotal,
			iptablesRestoreFailuresTotal, nftablesSyncFailuresTotal, proxyHealthzTotal, proxyLivezTotal,
			conntrackDeletedTotal, invalidObjectsTotal, skippedServicePorts, skippedServicePortsTotal,
		} {
			legacyregistry.MustRegister(c)
		}
	})
}

// trackerMetrics adapts servicemap.Metrics to the upstream counters.
type trackerMetrics struct{}

func (trackerMetrics) ServiceChange()                     { serviceChangesTotal.Inc() }
func (trackerMetrics) EndpointSliceChange()               { endpointChangesTotal.Inc() }
func (trackerMetrics) InvalidObject(kind string)          { invalidObjectsTotal.WithLabelValues(kind).Inc() }
func (trackerMetrics) PendingServices(n int)              { serviceChangesPending.Set(float64(n)) }
func (trackerMetrics) Consumed(_, _ int, _ time.Duration) {}

// rulesMetrics adapts rules.Metrics: a refused transaction counts as upstream's
// per-backend failure counter.
type rulesMetrics struct {
	family string // the ip_family label
}

func (m rulesMetrics) SyncDone(backend string, _ bool, _ time.Duration, err error) {
	if err == nil {
		return
	}
	if backend == "iptables" {
		iptablesRestoreFailuresTotal.WithLabelValues(m.family).Inc()
	} else {
		nftablesSyncFailuresTotal.WithLabelValues(m.family).Inc()
	}
}
