package main

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// toBeDeletedTaint marks a node the cluster autoscaler is about to remove;
// upstream's healthz then reports the node ineligible so load balancers drain it.
const toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// proxierHealth and proxyHealth are upstream's healthz JSON body
// (pkg/proxy/healthcheck/proxy_health.go).
type proxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

type proxyHealth struct {
	LastUpdated  time.Time                     `json:"lastUpdated"`
	CurrentTime  time.Time                     `json:"currentTime"`
	NodeEligible *bool                         `json:"nodeEligible,omitempty"`
	Healthy      bool                          `json:"healthy"`
	Status       map[v1.IPFamily]proxierHealth `json:"status,omitempty"`
}

// healthServer answers /healthz and /livez with upstream's staleness rule: the
// proxy is unhealthy once a queued update has waited longer than healthTimeout
// (2 x syncPeriod) without a successful sync. /healthz also requires the Node to
// exist, not be deleting and not carry the autoscaler's to-be-deleted taint.
type healthServer struct {
	clock   clock.PassiveClock
	timeout time.Duration
	node    func() *v1.Node

	mu            sync.RWMutex
	lastUpdated   map[v1.IPFamily]time.Time
	oldestPending map[v1.IPFamily]time.Time
}

func newHealthServer(c clock.PassiveClock, timeout time.Duration, node func() *v1.Node) *healthServer {
	return &healthServer{
		clock: c, timeout: timeout, node: node,
		lastUpdated:   map[v1.IPFamily]time.Time{},
		oldestPending: map[v1.IPFamily]time.Time{},
	}
}

// Updated records a successful sync (or the start of the sync loop).
func (h *healthServer) Updated(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestPending, family)
	h.lastUpdated[family] = h.clock.Now()
}

// QueuedUpdate records that a change is waiting for a sync; only the oldest
// waiting change counts.
func (h *healthServer) QueuedUpdate(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.oldestPending[family]; !ok {
		h.oldestPending[family] = h.clock.Now()
	}
}

func (h *healthServer) health() proxyHealth {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := proxyHealth{Healthy: true, Status: map[v1.IPFamily]proxierHealth{}}
	var last time.Time
	for fam, t := range h.lastUpdated {
		if t.After(last) {
			last = t
		}
		out.Status[fam] = proxierHealth{LastUpdated: t, Healthy: true}
	}
	now := h.clock.Now()
	out.CurrentTime = now
	for fam, t := range h.lastUpdated {
		pending, ok := h.oldestPending[fam]
		if !ok || now.Sub(pending) < h.timeout {
			continue
		}
		out.Healthy = false
		out.Status[fam] = proxierHealth{LastUpdated: t, Healthy: false}
	}
	out.LastUpdated = last
	return out
}

func (h *healthServer) nodeEligible() bool {
	n := h.node()
	if n == nil || !n.DeletionTimestamp.IsZero() {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == toBeDeletedTaint {
			return false
		}
	}
	return true
}

func (h *healthServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		hl := h.health()
		eligible := h.nodeEligible()
		hl.NodeEligible = ptr.To(eligible)
		h.write(w, hl, hl.Healthy && eligible, proxyHealthzTotal)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		hl := h.health()
		h.write(w, hl, hl.Healthy, proxyLivezTotal)
	})
	return mux
}

func (h *healthServer) write(w http.ResponseWriter, hl proxyHealth, healthy bool, count *metrics.CounterVec) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if healthy {
		count.WithLabelValues("200").Inc()
		// Upstream reports the answer's time as lastUpdated when healthy.
		hl.LastUpdated = h.clock.Now()
		w.WriteHeader(http.StatusOK)
	} else {
		count.WithLabelValues("503").Inc()
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	body, _ := json.Marshal(hl)
	_, _ = w.Write(body)
}
