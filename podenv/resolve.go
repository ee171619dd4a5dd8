package podenv

import (
	"context"
	"fmt"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodekit-dev/nodekit/internal/downward"
)

// resolver reads the references of one container, fetching each configMap and
// secret at most once, as the kubelet does within one makeEnvironmentVariables.
type resolver struct {
	b          *Builder
	ctx        context.Context
	pod        *corev1.Pod
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

// notFound is the error the kubelet's watch-based configMap and secret managers
// return: resource "configmap" / "secret" in the singular, so the message reads
// `configmap "x" not found`.
type notFound struct {
	api error
}

func (e *notFound) Error() string   { return e.api.Error() }
func (e *notFound) Unwrap() []error { return []error{ErrNotFound, e.api} }

func newNotFound(resource, name string) error {
	return &notFound{api: apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)}
}

type sourceError struct {
	what string
	err  error
}

func (e *sourceError) Error() string   { return fmt.Sprintf("couldn't get %s: %v", e.what, e.err) }
func (e *sourceError) Unwrap() []error { return []error{ErrSource, e.err} }

// configMap returns the ConfigMap, or nil when it is missing and optional.
func (r *resolver) configMap(name string, optional *bool) (*corev1.ConfigMap, error) {
	if cm, ok := r.configMaps[name]; ok {
		return cm, nil
	}
	cm, err := r.b.cfg.Source.ConfigMap(r.ctx, r.pod.Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) {
			if optional != nil && *optional {
				return nil, nil
			}
			return nil, newNotFound("configmap", name)
		}
		return nil, &sourceError{what: fmt.Sprintf("configMap %s/%s", r.pod.Namespace, name), err: err}
	}
	if cm == nil {
		return nil, newNotFound("configmap", name)
	}
	r.configMaps[name] = cm
	return cm, nil
}

// secret returns the Secret, or nil when it is missing and optional.
func (r *resolver) secret(name string, optional *bool) (*corev1.Secret, error) {
	if s, ok := r.secrets[name]; ok {
		return s, nil
	}
	s, err := r.b.cfg.Source.Secret(r.ctx, r.pod.Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) {
			if optional != nil && *optional {
				return nil, nil
			}
			return nil, newNotFound("secret", name)
		}
		return nil, &sourceError{what: fmt.Sprintf("secret %s/%s", r.pod.Namespace, name), err: err}
	}
	if s == nil {
		return nil, newNotFound("secret", name)
	}
	r.secrets[name] = s
	return s, nil
}

// valueFrom resolves one env entry's source. skip reports an optional source
// that is missing: the kubelet leaves such a variable out altogether.
func (r *resolver) valueFrom(src *corev1.EnvVarSource, c *corev1.Container, podIPs, hostIPs []string) (value string, skip bool, err error) {
	switch {
	case src.FieldRef != nil:
		v, err := fieldValue(src.FieldRef, r.pod, podIPs, hostIPs)
		if err != nil {
			return "", false, &fieldError{err}
		}
		return v, false, nil
	case src.ResourceFieldRef != nil:
		// The kubelet defaults the limits of the pod's app containers and of the
		// container itself, then looks the named container up in that pod: a
		// named init container keeps its own (possibly unset) limits.
		target := downward.DefaultLimits(r.pod, c, r.b.cfg.NodeAllocatable)
		if name := src.ResourceFieldRef.ContainerName; name != "" {
			found, init, err := downward.FindContainer(r.pod, name)
			if err != nil {
				return "", false, &fieldError{err}
			}
			target = found
			if !init {
				target = downward.DefaultLimits(r.pod, found, r.b.cfg.NodeAllocatable)
			}
		}
		v, err := downward.ResourceValue(src.ResourceFieldRef, target)
		if err != nil {
			return "", false, &fieldError{err}
		}
		return v, false, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := r.configMap(ref.Name, ref.Optional)
		if err != nil {
			return "", false, err
		}
		if cm == nil {
			return "", true, nil
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional {
				return "", true, nil
			}
			return "", false, &keyError{fmt.Sprintf("couldn't find key %v in ConfigMap %v/%v", ref.Key, r.pod.Namespace, ref.Name)}
		}
		return v, false, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := r.secret(ref.Name, ref.Optional)
		if err != nil {
			return "", false, err
		}
		if s == nil {
			return "", true, nil
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional {
				return "", true, nil
			}
			return "", false, &keyError{fmt.Sprintf("couldn't find key %v in Secret %v/%v", ref.Key, r.pod.Namespace, ref.Name)}
		}
		return string(v), false, nil
	case src.FileKeyRef != nil:
		return r.fileKey(src.FileKeyRef)
	}
	// An empty valueFrom: the kubelet sets the variable to "".
	return "", false, nil
}

type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }
func (e *keyError) Unwrap() error { return ErrMissingKey }

type fieldError struct{ err error }

func (e *fieldError) Error() string   { return e.err.Error() }
func (e *fieldError) Unwrap() []error { return []error{ErrInvalidFieldRef, e.err} }

// fieldValue is the kubelet's podFieldSelectorRuntimeValue.
func fieldValue(fs *corev1.ObjectFieldSelector, pod *corev1.Pod, podIPs, hostIPs []string) (string, error) {
	path, err := downward.CheckFieldLabel(fs.APIVersion, fs.FieldPath)
	if err != nil {
		return "", err
	}
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		if len(hostIPs) == 0 {
			return "", fmt.Errorf("host IP unknown; known addresses: %v", hostIPs)
		}
		return hostIPs[0], nil
	case "status.hostIPs":
		if len(hostIPs) == 0 {
			return "", fmt.Errorf("host IP unknown; known addresses: %v", hostIPs)
		}
		return strings.Join(hostIPs, ","), nil
	case "status.podIP":
		if len(podIPs) == 0 {
			return "", nil
		}
		return podIPs[0], nil
	case "status.podIPs":
		return strings.Join(podIPs, ","), nil
	}
	return downward.Metadata(pod, path)
}

// fileKey reads a fileKeyRef (the EnvFiles feature, on by default since
// v1.35): the file at path inside one of the pod's volumes, resolved as if the
// volume were the root (securejoin, as upstream), parsed strictly. A key that is
// missing or empty is an error unless optional.
func (r *resolver) fileKey(ref *corev1.FileKeySelector) (string, bool, error) {
	optional := ref.Optional != nil && *ref.Optional
	if r.b.cfg.VolumePath == nil {
		return "", false, &fieldError{fmt.Errorf("cannot find the volume %q referenced by FileKeyRef", ref.VolumeName)}
	}
	dir, err := r.b.cfg.VolumePath(r.pod, ref.VolumeName)
	if err != nil {
		return "", false, &fieldError{fmt.Errorf("cannot find the volume %q referenced by FileKeyRef: %w", ref.VolumeName, err)}
	}
	path, err := securejoin.SecureJoin(dir, ref.Path)
	if err != nil {
		return "", false, &fieldError{err}
	}
	v, err := envFileValue(path, ref.Key)
	if err != nil {
		logr.FromContextOrDiscard(r.ctx).Error(err, "Failed to parse env file", "pod", r.pod.Namespace+"/"+r.pod.Name)
		// The pod is told no more than the kubelet tells it.
		return "", false, &fieldError{&hiddenError{msg: "couldn't parse env file", err: err}}
	}
	if v == "" {
		if optional {
			return "", true, nil
		}
		return "", false, &keyError{fmt.Sprintf("environment variable key %q not found in file %q", ref.Key, path)}
	}
	return v, false, nil
}

// hiddenError shows a fixed message and keeps the cause for errors.Is/As and logs.
type hiddenError struct {
	msg string
	err error
}

func (e *hiddenError) Error() string { return e.msg }
func (e *hiddenError) Unwrap() error { return e.err }
