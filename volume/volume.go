package volume

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"
)

// Sources reads the API objects volumes are made from. ConfigMap and Secret return
// an error for which apierrors.IsNotFound is true when the object does not exist.
type Sources interface {
	// ConfigMap returns the ConfigMap namespace/name.
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	// Secret returns the Secret namespace/name.
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	// ServiceAccountToken creates a token for the service account namespace/name
	// (the serviceaccounts/token subresource) and returns the answered request.
	ServiceAccountToken(ctx context.Context, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

// Mounter mounts and unmounts tmpfs. The default uses mount(2) and umount(2).
type Mounter interface {
	// MountTmpfs mounts a tmpfs on target; sizeBytes 0 means the kernel default.
	MountTmpfs(target string, sizeBytes int64) error
	// Unmount unmounts target.
	Unmount(target string) error
	// IsMountPoint reports whether path is a mount point.
	IsMountPoint(path string) (bool, error)
}

// Config configures a Manager.
type Config struct {
	// RootDir is the kubelet's root folder. Default /var/lib/kubelet.
	RootDir string
	// Sources reads ConfigMaps, Secrets and service account tokens. Required for
	// pods with configMap, secret or projected volumes; nil makes those fail.
	Sources Sources
	// Clock times token rotation. Default the real clock.
	Clock clock.Clock
	// NodeAllocatable defaults the limits a downwardAPI resourceFieldRef reads when
	// the container sets none, as the kubelet does.
	NodeAllocatable corev1.ResourceList
	// Mounter mounts tmpfs for medium Memory. Default mount(2); NoMount keeps
	// everything on disk.
	Mounter Mounter
}

// Errors. Setup, Mounts and Teardown wrap these (errors.Is).
var (
	// ErrInvalidConfig: New was given an unusable Config.
	ErrInvalidConfig = errors.New("invalid volume config")
	// ErrUnsupportedVolume: the pod has a volume of a type this package does not set up.
	ErrUnsupportedVolume = errors.New("unsupported volume type")
	// ErrSetup: a volume could not be set up (the kubelet's FailedMount).
	ErrSetup = errors.New("volume setup failed")
	// ErrHostPathType: a hostPath volume's path is not of the type it declares.
	ErrHostPathType = errors.New("hostPath type check failed")
	// ErrInvalidSubPath: a subPath or subPathExpr leaves its volume or cannot be resolved.
	ErrInvalidSubPath = errors.New("invalid subPath")
	// ErrInvalidPod: the pod lacks a UID, or a volumeMount names no volume of the pod.
	ErrInvalidPod = errors.New("invalid pod")
	// ErrNotSetUp: Mounts was asked for a volume Setup has not made.
	ErrNotSetUp = errors.New("volume not set up")
	// ErrInvalidPath: an item path is absolute, contains "..", or is otherwise unusable.
	ErrInvalidPath = errors.New("invalid path")
)

// SetupError is one volume's failure. Its message is the kubelet's FailedMount
// event message: `MountVolume.SetUp failed for volume "v" : <cause>`.
type SetupError struct {
	// Volume is the volume's name in the pod spec.
	Volume string
	// Err is the cause.
	Err error
}

func (e *SetupError) Error() string {
	return fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", e.Volume, e.Err)
}

// Unwrap exposes ErrSetup and the cause.
func (e *SetupError) Unwrap() []error { return []error{ErrSetup, e.Err} }

// UnsupportedError is a volume of a type this package does not set up.
type UnsupportedError struct {
	// Volume is the volume's name, Type its type as in the pod spec (e.g. "nfs").
	Volume, Type string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("volume %q has unsupported type %q", e.Volume, e.Type)
}

// Unwrap returns ErrUnsupportedVolume.
func (e *UnsupportedError) Unwrap() error { return ErrUnsupportedVolume }

// Manager sets up, mounts and tears down pod volumes. Build one with New.
type Manager struct {
	cfg Config
}

// New validates cfg and returns a Manager.
func New(cfg Config) (*Manager, error) {
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	if !filepath.IsAbs(cfg.RootDir) {
		return nil, fmt.Errorf("%w: RootDir %q is not absolute", ErrInvalidConfig, cfg.RootDir)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Manager{cfg: cfg}, nil
}

// PodVolumesDir returns <RootDir>/pods/<uid>/volumes.
func (m *Manager) PodVolumesDir(uid types.UID) string {
	return filepath.Join(m.cfg.RootDir, "pods", string(uid), "volumes")
}

// Setup makes every volume of pod. It is idempotent: called again it refreshes
// configMap, secret, downwardAPI and projected contents and rotates tokens due for
// it. A volume that fails does not stop the others; the error joins one
// *SetupError or *UnsupportedError per failed volume.
func (m *Manager) Setup(ctx context.Context, pod *corev1.Pod) error {
	return errors.New("volume: not implemented yet")
}

// Mounts returns the CRI mounts for container's volumeMounts, in their order.
// subPathExpr is expanded against env (the container's environment, as podenv
// computes it); env may be left out when no mount uses subPathExpr.
func (m *Manager) Mounts(pod *corev1.Pod, container *corev1.Container, env ...*runtimeapi.KeyValue) ([]*runtimeapi.Mount, error) {
	return nil, errors.New("volume: not implemented yet")
}

// Teardown unmounts and removes every volume of the pod with podUID, and the
// pod's subPath bind mounts. Missing folders are not an error.
func (m *Manager) Teardown(ctx context.Context, podUID types.UID) error {
	return errors.New("volume: not implemented yet")
}
