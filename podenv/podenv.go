package podenv

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Source reads the API objects a container's environment refers to. Each method
// returns an error for which apierrors.IsNotFound is true when the object does
// not exist; Env turns that into the kubelet's message. Implementations are
// usually backed by informer caches; podenvtest.Source is an in-memory one.
type Source interface {
	// ConfigMap returns the ConfigMap namespace/name.
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	// Secret returns the Secret namespace/name.
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	// Services returns every Service in namespace.
	Services(ctx context.Context, namespace string) ([]*corev1.Service, error)
}

// Config configures a Builder.
type Config struct {
	// Source reads ConfigMaps, Secrets and Services. Required.
	Source Source
	// NodeAllocatable is the node's allocatable resources, the default for a
	// limits.cpu, limits.memory or limits.ephemeral-storage resourceFieldRef when
	// the container sets no limit. Empty means no default (the value is then 0,
	// or the request's ceiling for CPU as upstream computes it from 0).
	NodeAllocatable corev1.ResourceList
	// MasterServiceNamespace is the namespace of the `kubernetes` service whose
	// variables every container gets. Default "default" (the kubelet's
	// --master-service-namespace, deprecated but still honoured).
	MasterServiceNamespace string
}

// Errors. Env's errors wrap one of these (errors.Is), and their messages are the
// kubelet's.
var (
	// ErrInvalidConfig: New was given an unusable Config.
	ErrInvalidConfig = errors.New("invalid podenv config")
	// ErrNotFound: a referenced configMap or secret does not exist and the
	// reference is not optional. The message reads `configmap "x" not found`.
	ErrNotFound = errors.New("not found")
	// ErrMissingKey: a configMapKeyRef or secretKeyRef names a key the object does
	// not have and is not optional (`couldn't find key k in ConfigMap ns/x`).
	ErrMissingKey = errors.New("missing key")
	// ErrInvalidFieldRef: a fieldRef or resourceFieldRef names a field the kubelet
	// does not support, or the pod has no value for it.
	ErrInvalidFieldRef = errors.New("invalid field reference")
	// ErrSource: the Source failed for another reason than NotFound.
	ErrSource = errors.New("source failed")
)

// Builder computes container environments. Build one with New.
type Builder struct {
	cfg Config
}

// New validates cfg and returns a Builder.
func New(cfg Config) (*Builder, error) {
	if cfg.Source == nil {
		return nil, errors.Join(ErrInvalidConfig, errors.New("Source is required"))
	}
	if cfg.MasterServiceNamespace == "" {
		cfg.MasterServiceNamespace = "default"
	}
	return &Builder{cfg: cfg}, nil
}

// Env returns the environment of container in pod as the kubelet computes it.
// podIPs and hostIPs are the pod's and node's addresses, primary family first
// (they fill status.podIP(s) and status.hostIP(s)). The container may be one of
// pod.Spec.InitContainers, Containers or EphemeralContainers (as a Container).
func (b *Builder) Env(ctx context.Context, pod *corev1.Pod, container *corev1.Container, podIPs, hostIPs []string) ([]*runtimeapi.KeyValue, error) {
	return nil, errors.New("podenv: not implemented yet")
}
