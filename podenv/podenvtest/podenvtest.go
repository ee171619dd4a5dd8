// Package podenvtest holds an in-memory podenv.Source for unit tests of code that
// computes container environments.
package podenvtest

import (
	"context"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Source serves the objects added to it. Missing objects give the API server's
// NotFound error; Err, when set, is returned by every call instead. It is safe for
// concurrent use.
type Source struct {
	mu         sync.Mutex
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	services   map[string]*corev1.Service
	// Err, when non-nil, is returned by every call.
	Err   error
	calls []string
}

// New returns a Source holding objs (ConfigMaps, Secrets and Services; others
// are ignored).
func New(objs ...any) *Source {
	s := &Source{
		configMaps: map[string]*corev1.ConfigMap{},
		secrets:    map[string]*corev1.Secret{},
		services:   map[string]*corev1.Service{},
	}
	for _, o := range objs {
		s.Add(o)
	}
	return s
}

// Add adds or replaces a ConfigMap, Secret or Service.
func (s *Source) Add(obj any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		s.configMaps[o.Namespace+"/"+o.Name] = o.DeepCopy()
	case *corev1.Secret:
		s.secrets[o.Namespace+"/"+o.Name] = o.DeepCopy()
	case *corev1.Service:
		s.services[o.Namespace+"/"+o.Name] = o.DeepCopy()
	}
}

// Calls returns the calls made so far, as "configmap ns/name", "secret ns/name"
// or "services ns".
func (s *Source) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// ConfigMap implements podenv.Source.
func (s *Source) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "configmap "+namespace+"/"+name)
	if err := s.fail(ctx); err != nil {
		return nil, err
	}
	cm, ok := s.configMaps[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
	}
	return cm.DeepCopy(), nil
}

// Secret implements podenv.Source.
func (s *Source) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "secret "+namespace+"/"+name)
	if err := s.fail(ctx); err != nil {
		return nil, err
	}
	sec, ok := s.secrets[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
	}
	return sec.DeepCopy(), nil
}

// Services implements podenv.Source. Services come sorted by name.
func (s *Source) Services(ctx context.Context, namespace string) ([]*corev1.Service, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "services "+namespace)
	if err := s.fail(ctx); err != nil {
		return nil, err
	}
	var out []*corev1.Service
	for _, svc := range s.services {
		if svc.Namespace == namespace {
			out = append(out, svc.DeepCopy())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *Source) fail(ctx context.Context) error {
	if s.Err != nil {
		return s.Err
	}
	return ctx.Err()
}
