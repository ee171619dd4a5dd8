package podenv

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/downward"
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
	// the container (and the pod, for cpu and memory) sets no limit. Empty means
	// no default: an unset limit then reads "0".
	NodeAllocatable corev1.ResourceList
	// MasterServiceNamespace is the namespace of the `kubernetes` service whose
	// variables every container gets. Default "default" (the kubelet's
	// --master-service-namespace, deprecated but still honoured).
	MasterServiceNamespace string
	// VolumePath returns the host folder of one of the pod's volumes, for
	// fileKeyRef (volume.Manager.VolumePath fits). Nil: fileKeyRef references
	// fail with the kubelet's "cannot find the volume" message.
	VolumePath func(pod *corev1.Pod, volumeName string) (string, error)
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
		return nil, fmt.Errorf("%w: Source is required", ErrInvalidConfig)
	}
	if cfg.MasterServiceNamespace == "" {
		cfg.MasterServiceNamespace = metav1.NamespaceDefault
	}
	return &Builder{cfg: cfg}, nil
}

// Env returns the environment of container in pod as the kubelet computes it.
// podIPs and hostIPs are the pod's and node's addresses, primary family first
// (they fill status.podIP(s) and status.hostIP(s)). The container may be one of
// pod.Spec.InitContainers, Containers or an ephemeral container's common part.
//
// The first reference that cannot be resolved ends the computation with an error
// whose message is the kubelet's (the agent reports it as the container's
// CreateContainerConfigError).
func (b *Builder) Env(ctx context.Context, pod *corev1.Pod, container *corev1.Container, podIPs, hostIPs []string) ([]*runtimeapi.KeyValue, error) {
	if pod == nil || container == nil {
		return nil, fmt.Errorf("%w: pod and container are required", ErrInvalidFieldRef)
	}
	if pod.Spec.EnableServiceLinks == nil {
		// The API server defaults the field; a pod without it did not come from
		// there, and the kubelet refuses it with this message.
		return nil, errors.New("nil pod.spec.enableServiceLinks encountered, cannot construct envvars")
	}
	logger := logr.FromContextOrDiscard(ctx)

	serviceEnv, err := b.serviceEnv(ctx, pod.Namespace, *pod.Spec.EnableServiceLinks)
	if err != nil {
		return nil, err
	}

	r := resolver{b: b, ctx: ctx, pod: pod, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	env := newOrderedEnv()

	for _, from := range container.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := r.configMap(from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
			if err != nil {
				return nil, err
			}
			if cm == nil {
				continue
			}
			for _, k := range sortedKeys(cm.Data) {
				env.set(from.Prefix+k, cm.Data[k])
			}
		case from.SecretRef != nil:
			sec, err := r.secret(from.SecretRef.Name, from.SecretRef.Optional)
			if err != nil {
				return nil, err
			}
			if sec == nil {
				continue
			}
			for _, k := range sortedKeys(sec.Data) {
				env.set(from.Prefix+k, string(sec.Data[k]))
			}
		}
	}

	lookup := downward.Lookup(env.values, serviceEnv)
	for i := range container.Env {
		ev := &container.Env[i]
		value := ev.Value
		switch {
		case value != "":
			value = downward.Expand(value, lookup)
		case ev.ValueFrom != nil:
			var skip bool
			value, skip, err = r.valueFrom(ev.ValueFrom, container, podIPs, hostIPs)
			if err != nil {
				return nil, err
			}
			if skip {
				logger.V(4).Info("Optional environment variable source missing, leaving the variable out", "pod", pod.Namespace+"/"+pod.Name, "container", container.Name, "name", ev.Name)
				continue
			}
		}
		env.define(ev.Name, value)
	}

	order := env.order()
	out := make([]*runtimeapi.KeyValue, 0, len(order)+len(serviceEnv))
	for _, name := range order {
		out = append(out, &runtimeapi.KeyValue{Key: name, Value: []byte(env.values[name])})
	}
	for _, name := range sortedKeys(serviceEnv) {
		if _, mine := env.values[name]; mine {
			continue
		}
		out = append(out, &runtimeapi.KeyValue{Key: name, Value: []byte(serviceEnv[name])})
	}
	return out, nil
}

// orderedEnv is the kubelet's tmpEnv map plus the order Env reports: envFrom
// names first (in definition order) unless an env entry redefines them, then env
// entries in declaration order.
type orderedEnv struct {
	values   map[string]string
	fromEnv  map[string]bool
	fromList []string
	envList  []string
}

func newOrderedEnv() *orderedEnv {
	return &orderedEnv{values: map[string]string{}, fromEnv: map[string]bool{}}
}

// set records an envFrom variable.
func (e *orderedEnv) set(name, value string) {
	if _, ok := e.values[name]; !ok {
		e.fromList = append(e.fromList, name)
	}
	e.values[name] = value
}

// define records an env entry; a later entry of the same name replaces the value
// but keeps the first entry's place.
func (e *orderedEnv) define(name, value string) {
	if !e.fromEnv[name] {
		e.fromEnv[name] = true
		e.envList = append(e.envList, name)
	}
	e.values[name] = value
}

func (e *orderedEnv) order() []string {
	out := make([]string, 0, len(e.fromList)+len(e.envList))
	for _, n := range e.fromList {
		if !e.fromEnv[n] {
			out = append(out, n)
		}
	}
	return append(out, e.envList...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
