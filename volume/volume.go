package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
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

// Mounter mounts and unmounts. The default, SystemMounter, uses mount(2);
// NoMount mounts nothing.
type Mounter interface {
	// MountTmpfs mounts a tmpfs on target; sizeBytes 0 means the kernel default.
	MountTmpfs(target string, sizeBytes int64) error
	// BindMount bind-mounts source on target.
	BindMount(source, target string) error
	// Unmount unmounts target.
	Unmount(target string) error
	// MountPoints lists the mount points at or below dir, deepest first.
	MountPoints(dir string) ([]string, error)
}

// Config configures a Manager.
type Config struct {
	// RootDir is the kubelet's root folder. Default /var/lib/kubelet. Symlinks
	// in it are resolved when it exists.
	RootDir string
	// Sources reads ConfigMaps, Secrets and service account tokens. Required for
	// pods with configMap, secret or projected volumes; nil makes those fail.
	Sources Sources
	// TrustAnchors answers the clusterTrustBundle sources of projected volumes
	// (ClusterTrustBundles is the kubelet's). Nil makes those fail, as the
	// kubelet's static mode does.
	TrustAnchors TrustAnchors
	// PodCertificates answers the podCertificate sources of projected volumes
	// (PodCertificateIssuer is the kubelet's). Nil makes those fail.
	PodCertificates PodCertificates
	// Clock times token rotation. Default the real clock.
	Clock clock.Clock
	// NodeAllocatable defaults the limits a downwardAPI resourceFieldRef reads when
	// the container sets none, as the kubelet does.
	NodeAllocatable corev1.ResourceList
	// Mounter mounts tmpfs for medium Memory, secret, downwardAPI and projected
	// volumes, and pins subPaths with bind mounts. Default SystemMounter
	// (mount(2), root only); NoMount keeps everything on disk.
	Mounter Mounter
	// RuntimeSupportsRecursiveReadOnly says whether the container runtime
	// handles recursive read-only mounts (CRI RuntimeHandlerFeatures); it decides
	// recursiveReadOnly: IfPossible and whether Enabled is an error. Default false.
	RuntimeSupportsRecursiveReadOnly bool
	// Metrics receives one call per volume mounted or unmounted. Default none.
	Metrics Metrics
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

// The kubelet's folder names for the plugins this package implements.
const (
	pluginEmptyDir    = "kubernetes.io~empty-dir"
	pluginConfigMap   = "kubernetes.io~configmap"
	pluginSecret      = "kubernetes.io~secret"
	pluginDownwardAPI = "kubernetes.io~downward-api"
	pluginProjected   = "kubernetes.io~projected"
)

// defaultMode is the API server's default for defaultMode.
const defaultMode int32 = 0o644

// Manager sets up, mounts and tears down pod volumes. Build one with New.
type Manager struct {
	cfg    Config
	tokens *tokenCache

	mu   sync.Mutex
	pods map[types.UID]*podLock
}

// podLock serializes the calls for one pod; refs counts holders and waiters so
// the entry goes away with the last of them.
type podLock struct {
	mu   sync.Mutex
	refs int
}

// New validates cfg and returns a Manager.
func New(cfg Config) (*Manager, error) {
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	if !filepath.IsAbs(cfg.RootDir) {
		return nil, fmt.Errorf("%w: RootDir %q is not absolute", ErrInvalidConfig, cfg.RootDir)
	}
	cfg.RootDir = filepath.Clean(cfg.RootDir)
	// Mount points are compared by their real paths (mountinfo never shows
	// symlinks), so a RootDir under a symlink must be resolved: otherwise
	// Teardown would miss a mount and remove through it.
	if real, err := filepath.EvalSymlinks(cfg.RootDir); err == nil {
		cfg.RootDir = real
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Mounter == nil {
		cfg.Mounter = SystemMounter{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	return &Manager{cfg: cfg, tokens: newTokenCache(cfg.Clock), pods: map[types.UID]*podLock{}}, nil
}

// PodDir returns <RootDir>/pods/<uid>.
func (m *Manager) PodDir(uid types.UID) string {
	return filepath.Join(m.cfg.RootDir, "pods", string(uid))
}

// PodVolumesDir returns <RootDir>/pods/<uid>/volumes.
func (m *Manager) PodVolumesDir(uid types.UID) string {
	return filepath.Join(m.PodDir(uid), "volumes")
}

func (m *Manager) lockPod(uid types.UID) func() {
	m.mu.Lock()
	l, ok := m.pods[uid]
	if !ok {
		l = &podLock{}
		m.pods[uid] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(m.pods, uid)
		}
		m.mu.Unlock()
	}
}

func checkUID(uid types.UID) error {
	s := string(uid)
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%w: pod UID %q cannot name a folder", ErrInvalidPod, s)
	}
	return nil
}

// Setup makes every volume of pod. It is idempotent: called again it refreshes
// configMap, secret, downwardAPI and projected contents and rotates tokens due for
// it. A volume that fails does not stop the others; the error joins one
// *SetupError or *UnsupportedError per failed volume.
func (m *Manager) Setup(ctx context.Context, pod *corev1.Pod) error {
	if pod == nil {
		return fmt.Errorf("%w: nil pod", ErrInvalidPod)
	}
	if err := checkUID(pod.UID); err != nil {
		return err
	}
	unlock := m.lockPod(pod.UID)
	defer unlock()
	logger := logr.FromContextOrDiscard(ctx).WithValues("pod", pod.Namespace+"/"+pod.Name, "podUID", pod.UID)

	for _, d := range []string{m.PodDir(pod.UID), m.PodVolumesDir(pod.UID)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	var errs []error
	seen := map[string]bool{}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if err := validateName(v.Name); err != nil || seen[v.Name] {
			if err == nil {
				err = fmt.Errorf("%w: volume %q is declared twice", ErrInvalidPod, v.Name)
			}
			errs = append(errs, &SetupError{Volume: v.Name, Err: err})
			continue
		}
		seen[v.Name] = true
		if err := m.setupVolume(ctx, pod, v); err != nil {
			logger.V(0).Info("Volume setup failed", "volume", v.Name, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func validateName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w: volume name %q cannot name a folder", ErrInvalidPod, name)
	}
	return nil
}

// volumeType names the set field of a VolumeSource by its JSON name ("nfs",
// "persistentVolumeClaim"), or "" when none is set.
func volumeType(src *corev1.VolumeSource) string {
	v := reflect.ValueOf(src).Elem()
	t := v.Type()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return ""
}

func (m *Manager) setupVolume(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) error {
	began := m.cfg.Clock.Now()
	wrap := func(plugin string, err error) error {
		m.cfg.Metrics.VolumeOperation(plugin, "volume_mount", m.cfg.Clock.Since(began), err)
		if err == nil {
			return nil
		}
		return &SetupError{Volume: v.Name, Err: err}
	}
	switch {
	case v.EmptyDir != nil:
		return wrap("kubernetes.io/empty-dir", m.setupEmptyDir(pod, v))
	case v.HostPath != nil:
		return wrap("kubernetes.io/host-path", checkHostPath(v.HostPath))
	case v.ConfigMap != nil:
		return wrap("kubernetes.io/configmap", m.setupConfigMap(ctx, pod, v))
	case v.Secret != nil:
		return wrap("kubernetes.io/secret", m.setupSecret(ctx, pod, v))
	case v.DownwardAPI != nil:
		return wrap("kubernetes.io/downward-api", m.setupDownwardAPI(ctx, pod, v))
	case v.Projected != nil:
		return wrap("kubernetes.io/projected", m.setupProjected(ctx, pod, v))
	case v.Image != nil:
		// Like upstream's kubernetes.io/image plugin: nothing on disk, the runtime
		// mounts the image itself (see Mounts) once the agent has pulled it.
		return wrap("kubernetes.io/image", nil)
	}
	t := volumeType(&v.VolumeSource)
	if t == "" {
		t = "none"
	}
	return &UnsupportedError{Volume: v.Name, Type: t}
}

// Teardown unmounts and removes every volume of the pod with podUID, and the
// pod's subPath bind mounts, and forgets its tokens. Nothing is removed while a
// mount below the pod's folders remains: removing through a leftover bind mount
// would delete the host's files. Missing folders are not an error.
func (m *Manager) Teardown(ctx context.Context, podUID types.UID) error {
	if err := checkUID(podUID); err != nil {
		return err
	}
	unlock := m.lockPod(podUID)
	defer unlock()
	logger := logr.FromContextOrDiscard(ctx).WithValues("podUID", podUID)

	dirs := []string{filepath.Join(m.PodDir(podUID), "volume-subpaths"), m.PodVolumesDir(podUID)}
	for _, d := range dirs {
		if err := ctx.Err(); err != nil {
			return err
		}
		mps, err := m.cfg.Mounter.MountPoints(d)
		if err != nil {
			return fmt.Errorf("listing mounts under %s: %w", d, err)
		}
		for _, mp := range mps {
			began := m.cfg.Clock.Now()
			err := m.cfg.Mounter.Unmount(mp)
			m.reportUnmount(d, mp, m.cfg.Clock.Since(began), err)
			if err != nil {
				return fmt.Errorf("tearing down pod %s: %w", podUID, err)
			}
			logger.V(4).Info("Unmounted", "path", mp)
		}
		if left, err := m.cfg.Mounter.MountPoints(d); err != nil || len(left) > 0 {
			return fmt.Errorf("tearing down pod %s: %s still has mounts %v (%v)", podUID, d, left, err)
		}
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("tearing down pod %s: %w", podUID, err)
		}
	}
	m.tokens.forget(podUID)
	if m.cfg.PodCertificates != nil {
		m.cfg.PodCertificates.Forget(podUID)
	}
	logger.V(4).Info("Pod volumes torn down")
	return nil
}

// PodsOnDisk lists the pod UIDs that have a folder under <RootDir>/pods, for an
// agent that restarts and must tear down the volumes of pods that are gone (the
// kubelet's cleanupOrphanedPodDirs). A missing pods folder is an empty list.
func (m *Manager) PodsOnDisk() ([]types.UID, error) {
	entries, err := os.ReadDir(filepath.Join(m.cfg.RootDir, "pods"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []types.UID
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, types.UID(e.Name()))
		}
	}
	return out, nil
}

// reportUnmount reports an unmount under dir to Metrics with the plugin of the
// volume folder it belongs to (subPath binds count for their volume's plugin
// when it can be told, else "kubernetes.io/subpath").
func (m *Manager) reportUnmount(dir, mountPoint string, d time.Duration, err error) {
	plugin := "kubernetes.io/subpath"
	if rel, relErr := filepath.Rel(dir, mountPoint); relErr == nil && filepath.Base(dir) == "volumes" {
		folder, _, _ := strings.Cut(rel, "/")
		plugin = pluginName(folder)
	}
	m.cfg.Metrics.VolumeOperation(plugin, "volume_unmount", d, err)
}
