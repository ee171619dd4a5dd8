package testenv

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// LogRecorder is a test's T that also keeps every Logf line, so a test can check
// what a harness reported (for example that a start was retried).
type LogRecorder struct {
	*testing.T
	mu    sync.Mutex
	lines []string
}

// Logf logs through the test's T and keeps the line.
func (r *LogRecorder) Logf(format string, args ...any) {
	r.T.Helper()
	r.mu.Lock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
	r.mu.Unlock()
	r.T.Logf(format, args...)
}

// Matching returns the kept lines that contain substr, in order.
func (r *LogRecorder) Matching(substr string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}
