// Package volumetest holds fakes for unit tests of code that uses the volume
// package: Sources, an in-memory API server for ConfigMaps, Secrets and
// service account tokens, and RecordingMounter, a mount table that mounts nothing.
package volumetest

import (
	"context"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"
)

// Sources serves the ConfigMaps and Secrets added to it and issues tokens
// "token-<n>" for the ServiceAccounts added to it, expiring
// expirationSeconds after the clock's now as the API server would. Missing
// objects give the API server's NotFound. It is safe for concurrent use.
type Sources struct {
	mu       sync.Mutex
	clock    clock.PassiveClock
	objects  map[string]any
	issued   int
	requests []*authenticationv1.TokenRequest
	// TokenErr, when non-nil, is returned by ServiceAccountToken.
	TokenErr error
}

// New returns Sources on clk (nil: the real clock) holding objs: ConfigMaps,
// Secrets and ServiceAccounts.
func New(clk clock.PassiveClock, objs ...any) *Sources {
	if clk == nil {
		clk = clock.RealClock{}
	}
	s := &Sources{clock: clk, objects: map[string]any{}}
	for _, o := range objs {
		s.Add(o)
	}
	return s
}

// Add adds or replaces a ConfigMap, Secret or ServiceAccount; other objects are ignored.
func (s *Sources) Add(obj any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		s.objects["configmap/"+o.Namespace+"/"+o.Name] = o.DeepCopy()
	case *corev1.Secret:
		s.objects["secret/"+o.Namespace+"/"+o.Name] = o.DeepCopy()
	case *corev1.ServiceAccount:
		s.objects["serviceaccount/"+o.Namespace+"/"+o.Name] = o.DeepCopy()
	}
}

// Delete removes an object by kind ("configmap", "secret", "serviceaccount").
func (s *Sources) Delete(kind, namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objects, kind+"/"+namespace+"/"+name)
}

// ConfigMap implements volume.Sources.
func (s *Sources) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.objects["configmap/"+namespace+"/"+name]; ok {
		return o.(*corev1.ConfigMap).DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

// Secret implements volume.Sources.
func (s *Sources) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.objects["secret/"+namespace+"/"+name]; ok {
		return o.(*corev1.Secret).DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

// ServiceAccountToken implements volume.Sources.
func (s *Sources) ServiceAccountToken(ctx context.Context, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, req.DeepCopy())
	if s.TokenErr != nil {
		return nil, s.TokenErr
	}
	if _, ok := s.objects["serviceaccount/"+namespace+"/"+name]; !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "serviceaccounts"}, name)
	}
	s.issued++
	out := req.DeepCopy()
	exp := int64(3600)
	if out.Spec.ExpirationSeconds != nil {
		exp = *out.Spec.ExpirationSeconds
	} else {
		out.Spec.ExpirationSeconds = &exp
	}
	out.Status = authenticationv1.TokenRequestStatus{
		Token:               fmt.Sprintf("token-%d", s.issued),
		ExpirationTimestamp: metav1.NewTime(s.clock.Now().Add(time.Duration(exp) * time.Second)),
	}
	return out, nil
}

// TokenRequests returns the token requests received so far.
func (s *Sources) TokenRequests() []*authenticationv1.TokenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*authenticationv1.TokenRequest, len(s.requests))
	for i, r := range s.requests {
		out[i] = r.DeepCopy()
	}
	return out
}
