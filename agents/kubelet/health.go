package main

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// health is /healthz: "ok" while the pod sync loop keeps turning, as the kubelet's
// syncLoop health check (it fails when the loop has not run for twice its
// housekeeping threshold; the kubelet uses 2 minutes).
type health struct {
	clock clock.Clock
	mu    sync.Mutex
	last  time.Time
}

const syncLoopHealthThreshold = 2 * time.Minute

func newHealth(c clock.Clock) *health { return &health{clock: c, last: c.Now()} }

func (h *health) tick() {
	h.mu.Lock()
	h.last = h.clock.Now()
	h.mu.Unlock()
}

func (h *health) check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.clock.Since(h.last); d > syncLoopHealthThreshold {
		return fmt.Errorf("sync Loop took longer than expected: last activity %s ago", d.Round(time.Second))
	}
	return nil
}

func (h *health) serve(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err := h.check(); err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "[-]syncloop failed: %v\nhealthz check failed\n", err)
		return
	}
	fmt.Fprint(w, "ok")
}
