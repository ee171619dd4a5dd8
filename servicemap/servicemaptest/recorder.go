package servicemaptest

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Recorder is a servicemap.Handler that records every call as a line such as
// "ServiceAdd default/web" or "EndpointSliceDelete default/web-abc", and forwards
// to Next when set. It is safe for concurrent use.
type Recorder struct {
	Next interface {
		OnServiceAdd(*corev1.Service)
		OnServiceUpdate(*corev1.Service, *corev1.Service)
		OnServiceDelete(*corev1.Service)
		OnEndpointSliceAdd(*discoveryv1.EndpointSlice)
		OnEndpointSliceUpdate(*discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice)
		OnEndpointSliceDelete(*discoveryv1.EndpointSlice)
	}

	mu    sync.Mutex
	calls []string
}

// Calls returns a copy of the recorded calls.
func (r *Recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *Recorder) record(kind, ns, name string) {
	r.mu.Lock()
	r.calls = append(r.calls, kind+" "+ns+"/"+name)
	r.mu.Unlock()
}

// OnServiceAdd records and forwards.
func (r *Recorder) OnServiceAdd(s *corev1.Service) {
	r.record("ServiceAdd", s.Namespace, s.Name)
	if r.Next != nil {
		r.Next.OnServiceAdd(s)
	}
}

// OnServiceUpdate records and forwards.
func (r *Recorder) OnServiceUpdate(o, s *corev1.Service) {
	r.record("ServiceUpdate", s.Namespace, s.Name)
	if r.Next != nil {
		r.Next.OnServiceUpdate(o, s)
	}
}

// OnServiceDelete records and forwards.
func (r *Recorder) OnServiceDelete(s *corev1.Service) {
	r.record("ServiceDelete", s.Namespace, s.Name)
	if r.Next != nil {
		r.Next.OnServiceDelete(s)
	}
}

// OnEndpointSliceAdd records and forwards.
func (r *Recorder) OnEndpointSliceAdd(es *discoveryv1.EndpointSlice) {
	r.record("EndpointSliceAdd", es.Namespace, es.Name)
	if r.Next != nil {
		r.Next.OnEndpointSliceAdd(es)
	}
}

// OnEndpointSliceUpdate records and forwards.
func (r *Recorder) OnEndpointSliceUpdate(o, es *discoveryv1.EndpointSlice) {
	r.record("EndpointSliceUpdate", es.Namespace, es.Name)
	if r.Next != nil {
		r.Next.OnEndpointSliceUpdate(o, es)
	}
}

// OnEndpointSliceDelete records and forwards.
func (r *Recorder) OnEndpointSliceDelete(es *discoveryv1.EndpointSlice) {
	r.record("EndpointSliceDelete", es.Namespace, es.Name)
	if r.Next != nil {
		r.Next.OnEndpointSliceDelete(es)
	}
}
