// Package probetest provides fakes for code that uses package probe: a scripted
// Prober (probe.Runner), an Execer, a pod status source, a metrics recorder and
// an event recorder. All are safe for concurrent use and record what they saw.
package probetest

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/probe"
)

// Call is one recorded probe.
type Call struct {
	Spec   *corev1.Probe
	Target probe.Target
}

// Step is one scripted answer.
type Step struct {
	Result probe.Result
	Err    error
}

// Prober is a scripted probe.Runner. Answers are taken from the queue for the
// target's container name (Script), else from Default; a nil Default answers
// Success. Every call is recorded and, when Calls is set, also sent on it.
type Prober struct {
	mu      sync.Mutex
	queues  map[string][]Step
	Default func(spec *corev1.Probe, target probe.Target) (probe.Result, error)
	calls   []Call
	// Calls, if not nil, receives each call after it is recorded (the send blocks).
	Calls chan Call
}

// Script appends answers for probes of the named container.
func (p *Prober) Script(container string, steps ...Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queues == nil {
		p.queues = map[string][]Step{}
	}
	p.queues[container] = append(p.queues[container], steps...)
}

// Probe implements probe.Runner.
func (p *Prober) Probe(ctx context.Context, spec *corev1.Probe, target probe.Target) (probe.Result, error) {
	name := ""
	if target.Container != nil {
		name = target.Container.Name
	}
	c := Call{Spec: spec, Target: target}
	p.mu.Lock()
	p.calls = append(p.calls, c)
	var (
		step Step
		have bool
	)
	if q := p.queues[name]; len(q) > 0 {
		step, have = q[0], true
		p.queues[name] = q[1:]
	}
	def := p.Default
	ch := p.Calls
	p.mu.Unlock()
	if ch != nil {
		select {
		case ch <- c:
		case <-ctx.Done():
		}
	}
	if have {
		return step.Result, step.Err
	}
	if def != nil {
		return def(spec, target)
	}
	return probe.Result{Kind: probe.Success}, nil
}

// Recorded returns a copy of the calls so far.
func (p *Prober) Recorded() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Call(nil), p.calls...)
}

// Execer is a fake probe.Execer: Func answers (nil answers exit 0 with no
// output) and every command is recorded.
type Execer struct {
	mu   sync.Mutex
	Func func(ctx context.Context, containerID string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error)
	cmds []ExecCall
}

// ExecCall is one recorded command.
type ExecCall struct {
	ContainerID string
	Cmd         []string
	Timeout     time.Duration
}

// ExecSync implements probe.Execer.
func (e *Execer) ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error) {
	e.mu.Lock()
	e.cmds = append(e.cmds, ExecCall{containerID, append([]string(nil), cmd...), timeout})
	f := e.Func
	e.mu.Unlock()
	if f == nil {
		return nil, nil, 0, nil
	}
	return f(ctx, containerID, cmd, timeout)
}

// Commands returns the recorded commands.
func (e *Execer) Commands() []ExecCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]ExecCall(nil), e.cmds...)
}

// Statuses is a probe.PodStatusProvider backed by a map. Set stores a copy, so
// callers may keep changing what they passed in.
type Statuses struct {
	mu sync.RWMutex
	m  map[types.UID]*corev1.PodStatus
}

// Set stores the status of a pod.
func (s *Statuses) Set(uid types.UID, st corev1.PodStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.UID]*corev1.PodStatus{}
	}
	s.m[uid] = st.DeepCopy()
}

// Delete forgets a pod.
func (s *Statuses) Delete(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, uid)
}

// PodStatus implements probe.PodStatusProvider.
func (s *Statuses) PodStatus(uid types.UID) (*corev1.PodStatus, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st, ok := s.m[uid]
	return st, ok
}

// Metrics records probe.Metrics calls.
type Metrics struct {
	mu        sync.Mutex
	counts    map[metricKey]int
	durations map[probe.MetricLabels][]time.Duration
	gone      []probe.MetricLabels
}

type metricKey struct {
	labels probe.MetricLabels
	result string
}

// ProbeCounted implements probe.Metrics.
func (m *Metrics) ProbeCounted(l probe.MetricLabels, result string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counts == nil {
		m.counts = map[metricKey]int{}
	}
	m.counts[metricKey{l, result}]++
}

// ProbeDuration implements probe.Metrics.
func (m *Metrics) ProbeDuration(l probe.MetricLabels, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.durations == nil {
		m.durations = map[probe.MetricLabels][]time.Duration{}
	}
	m.durations[l] = append(m.durations[l], d)
}

// WorkerGone implements probe.Metrics.
func (m *Metrics) WorkerGone(l probe.MetricLabels) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gone = append(m.gone, l)
}

// Count returns prober_probe_total for the labels and result.
func (m *Metrics) Count(l probe.MetricLabels, result string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counts[metricKey{l, result}]
}

// Durations returns the observed durations for the labels.
func (m *Metrics) Durations(l probe.MetricLabels) []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Duration(nil), m.durations[l]...)
}

// Gone returns the labels of workers that ended.
func (m *Metrics) Gone() []probe.MetricLabels {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]probe.MetricLabels(nil), m.gone...)
}

// Event is one recorded event.
type Event struct {
	PodUID    types.UID
	Container string
	Type      string
	Reason    string
	Message   string
}

// Events records probe.EventRecorder calls.
type Events struct {
	mu     sync.Mutex
	events []Event
}

// Event implements probe.EventRecorder.
func (e *Events) Event(pod *corev1.Pod, container, eventType, reason, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, Event{pod.UID, container, eventType, reason, message})
}

// Recorded returns the events so far.
func (e *Events) Recorded() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.events...)
}
