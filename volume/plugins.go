package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodekit-dev/nodekit/internal/downward"
)

// emptyDirPerm is the mode of an emptyDir on disk, whatever the umask.
const emptyDirPerm os.FileMode = 0o777

func (m *Manager) volumeDir(pod *corev1.Pod, plugin, name string) string {
	return filepath.Join(m.PodVolumesDir(pod.UID), plugin, name)
}

func (m *Manager) setupEmptyDir(pod *corev1.Pod, v *corev1.Volume) error {
	dir := m.volumeDir(pod, pluginEmptyDir, v.Name)
	switch v.EmptyDir.Medium {
	case corev1.StorageMediumDefault:
		if err := makeDir(dir); err != nil {
			return err
		}
	case corev1.StorageMediumMemory:
		if err := m.setupTmpfs(pod, dir, v.EmptyDir.SizeLimit); err != nil {
			return err
		}
	default:
		return fmt.Errorf("emptyDir medium %q is not supported by nodekit", v.EmptyDir.Medium)
	}
	return setOwnership(dir, fsGroup(pod), false)
}

// makeDir is the kubelet's emptyDir setupDir: the folder, mode 0777.
func makeDir(dir string) error {
	if err := os.MkdirAll(dir, emptyDirPerm); err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm() != emptyDirPerm {
		// The umask took bits away; put them back for this folder only.
		return os.Chmod(dir, emptyDirPerm)
	}
	return nil
}

// setupTmpfs mounts a tmpfs on dir unless one is there already.
func (m *Manager) setupTmpfs(pod *corev1.Pod, dir string, sizeLimit *resource.Quantity) error {
	if err := makeDir(dir); err != nil {
		return err
	}
	mps, err := m.cfg.Mounter.MountPoints(dir)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		if mp == dir {
			return nil
		}
	}
	return m.cfg.Mounter.MountTmpfs(dir, m.memorySize(pod, sizeLimit))
}

// memorySize is the kubelet's calculateEmptyDirMemorySize: node allocatable
// memory, lowered to the pod's memory limit when every container has one, lowered
// to the volume's sizeLimit when that is smaller still. 0 means the kernel's
// default (half of RAM).
func (m *Manager) memorySize(pod *corev1.Pod, sizeLimit *resource.Quantity) int64 {
	size := int64(0)
	if q, ok := m.cfg.NodeAllocatable[corev1.ResourceMemory]; ok {
		size = q.Value()
	}
	within := func(v int64) bool { return v > 0 && (size == 0 || v <= size) }
	if lim := podMemoryLimit(pod); within(lim) {
		size = lim
	}
	if sizeLimit != nil && within(sizeLimit.Value()) {
		size = sizeLimit.Value()
	}
	return size
}

// podMemoryLimit is the pod cgroup's memory limit: the pod-level limit if set,
// else, when every container has a limit, the larger of the app containers' sum
// (plus sidecars) and the largest init container; else 0.
func podMemoryLimit(pod *corev1.Pod) int64 {
	if pod.Spec.Resources != nil {
		if q, ok := pod.Spec.Resources.Limits[corev1.ResourceMemory]; ok && !q.IsZero() {
			return q.Value()
		}
	}
	var sum, initMax int64
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok || q.IsZero() {
			return 0
		}
		sum += q.Value()
	}
	for _, c := range pod.Spec.InitContainers {
		q, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok || q.IsZero() {
			return 0
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum += q.Value()
		} else if q.Value() > initMax {
			initMax = q.Value()
		}
	}
	return max(sum, initMax)
}

// checkHostPath is the kubelet's hostPath SetUp (pkg/volume/hostpath, v1.37.2):
// no "..", then the type check with its messages.
func checkHostPath(hp *corev1.HostPathVolumeSource) error {
	path := hp.Path
	if hasBackstep(path) {
		return fmt.Errorf("invalid HostPath `%s`: must not contain '..'", path)
	}
	if hp.Type == nil || *hp.Type == corev1.HostPathUnset {
		return nil
	}
	_, statErr := os.Stat(path)
	exists := statErr == nil
	match := func(expected string, want corev1.HostPathType) error {
		got, err := fileType(path)
		if err != nil {
			return &hostPathError{fmt.Sprintf("hostPath type check failed, %s is not a %s, unable to determine its type: %v", path, expected, err)}
		}
		if got != want {
			return &hostPathError{fmt.Sprintf("hostPath type check failed: %s is not a %s, it's a %s", path, expected, got)}
		}
		return nil
	}
	switch *hp.Type {
	case corev1.HostPathDirectoryOrCreate:
		if !exists {
			if err := os.MkdirAll(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			return nil
		}
		fallthrough
	case corev1.HostPathDirectory:
		return match("directory", corev1.HostPathDirectory)
	case corev1.HostPathFileOrCreate:
		if !exists {
			f, err := os.OpenFile(path, os.O_CREATE, 0o644)
			if f != nil {
				f.Close()
			}
			if err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			return nil
		}
		fallthrough
	case corev1.HostPathFile:
		return match("file", corev1.HostPathFile)
	case corev1.HostPathSocket:
		return match("socket file", corev1.HostPathSocket)
	case corev1.HostPathCharDev:
		return match("character device", corev1.HostPathCharDev)
	case corev1.HostPathBlockDev:
		return match("block device", corev1.HostPathBlockDev)
	}
	return &hostPathError{fmt.Sprintf("%s is an invalid volume type", *hp.Type)}
}

// fileType is the kubelet's hostutil getFileType: what path is, following symlinks.
func fileType(path string) (corev1.HostPathType, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("path %q does not exist", path)
	}
	if err != nil {
		return "", err
	}
	m := st.Mode()
	switch {
	case m.IsDir():
		return corev1.HostPathDirectory, nil
	case m.IsRegular():
		return corev1.HostPathFile, nil
	case m&fs.ModeSocket != 0:
		return corev1.HostPathSocket, nil
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		return corev1.HostPathCharDev, nil
	case m&fs.ModeDevice != 0:
		return corev1.HostPathBlockDev, nil
	}
	return "", errors.New("only recognise file, directory, socket, block device and character device")
}

// hostPathError keeps the kubelet's message and wraps ErrHostPathType.
type hostPathError struct{ msg string }

func (e *hostPathError) Error() string { return e.msg }
func (e *hostPathError) Unwrap() error { return ErrHostPathType }

// notFound is the error the kubelet's watch-based managers give for a missing
// object: resource in the singular, `configmap "x" not found`.
func notFound(resourceName, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: resourceName}, name)
}

func (m *Manager) sources() (Sources, error) {
	if m.cfg.Sources == nil {
		return nil, fmt.Errorf("%w: no Sources configured", ErrInvalidConfig)
	}
	return m.cfg.Sources, nil
}

func modeOr(mode *int32) int32 {
	if mode == nil {
		return defaultMode
	}
	return *mode
}

// configMapPayload is the configmap plugin's MakePayload.
func (m *Manager) configMapPayload(ctx context.Context, pod *corev1.Pod, name string, items []corev1.KeyToPath, mode int32, optional bool, payload map[string]file) error {
	src, err := m.sources()
	if err != nil {
		return err
	}
	cm, err := src.ConfigMap(ctx, pod.Namespace, name)
	if err != nil || cm == nil {
		if (err == nil || apierrors.IsNotFound(err)) && optional {
			return nil
		}
		if err == nil || apierrors.IsNotFound(err) {
			return notFound("configmap", name)
		}
		return err
	}
	if len(items) == 0 {
		for k, v := range cm.Data {
			payload[k] = file{data: []byte(v), mode: os.FileMode(mode)}
		}
		for k, v := range cm.BinaryData {
			payload[k] = file{data: v, mode: os.FileMode(mode)}
		}
		return nil
	}
	for _, it := range items {
		var data []byte
		if s, ok := cm.Data[it.Key]; ok {
			data = []byte(s)
		} else if b, ok := cm.BinaryData[it.Key]; ok {
			data = b
		} else {
			if optional {
				continue
			}
			return fmt.Errorf("configmap references non-existent config key: %s", it.Key)
		}
		payload[it.Path] = file{data: data, mode: os.FileMode(modeOr2(it.Mode, mode))}
	}
	return nil
}

func modeOr2(item *int32, def int32) int32 {
	if item != nil {
		return *item
	}
	return def
}

// secretPayload is the secret plugin's MakePayload.
func (m *Manager) secretPayload(ctx context.Context, pod *corev1.Pod, name string, items []corev1.KeyToPath, mode int32, optional bool, payload map[string]file) error {
	src, err := m.sources()
	if err != nil {
		return err
	}
	sec, err := src.Secret(ctx, pod.Namespace, name)
	if err != nil || sec == nil {
		if (err == nil || apierrors.IsNotFound(err)) && optional {
			return nil
		}
		if err == nil || apierrors.IsNotFound(err) {
			return notFound("secret", name)
		}
		return err
	}
	if len(items) == 0 {
		for k, v := range sec.Data {
			payload[k] = file{data: v, mode: os.FileMode(mode)}
		}
		return nil
	}
	for _, it := range items {
		data, ok := sec.Data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("references non-existent secret key: %s", it.Key)
		}
		payload[it.Path] = file{data: data, mode: os.FileMode(modeOr2(it.Mode, mode))}
	}
	return nil
}

// downwardPayload is the downwardapi plugin's CollectData; all items are tried
// and their errors joined.
func (m *Manager) downwardPayload(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode int32, payload map[string]file) error {
	var errs []error
	for _, it := range items {
		f := file{mode: os.FileMode(modeOr2(it.Mode, mode))}
		switch {
		case it.FieldRef != nil:
			v, err := downward.Metadata(pod, it.FieldRef.FieldPath)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			f.data = []byte(v)
		case it.ResourceFieldRef != nil:
			c, _, err := downward.FindContainer(pod, it.ResourceFieldRef.ContainerName)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// Node allocatable only: the volume plugin does not look at
			// pod-level limits (v1.37.2 downwardapi.CollectData).
			v, err := downward.ResourceValue(it.ResourceFieldRef, downward.DefaultLimits(nil, c, m.cfg.NodeAllocatable))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			f.data = []byte(v)
		}
		payload[filepath.Clean(it.Path)] = f
	}
	return aggregate(errs)
}

// aggregate joins errors the way apimachinery's NewAggregate prints them: one
// error as itself, several as "[a, b]".
func aggregate(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return &aggregateError{errs}
}

type aggregateError struct{ errs []error }

func (a *aggregateError) Error() string {
	s := "["
	for i, e := range a.errs {
		if i > 0 {
			s += ", "
		}
		s += e.Error()
	}
	return s + "]"
}

func (a *aggregateError) Unwrap() []error { return a.errs }

func (m *Manager) setupConfigMap(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) error {
	s := v.ConfigMap
	payload := map[string]file{}
	optional := s.Optional != nil && *s.Optional
	if err := m.configMapPayload(ctx, pod, s.Name, s.Items, modeOr(s.DefaultMode), optional, payload); err != nil {
		return err
	}
	dir := m.volumeDir(pod, pluginConfigMap, v.Name)
	if err := makeDir(dir); err != nil {
		return err
	}
	return m.write(ctx, pod, v.Name, dir, payload)
}

func (m *Manager) setupSecret(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) error {
	s := v.Secret
	payload := map[string]file{}
	optional := s.Optional != nil && *s.Optional
	if err := m.secretPayload(ctx, pod, s.SecretName, s.Items, modeOr(s.DefaultMode), optional, payload); err != nil {
		return err
	}
	dir := m.volumeDir(pod, pluginSecret, v.Name)
	if err := m.setupTmpfs(pod, dir, nil); err != nil {
		return err
	}
	return m.write(ctx, pod, v.Name, dir, payload)
}

func (m *Manager) setupDownwardAPI(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) error {
	payload := map[string]file{}
	if err := m.downwardPayload(pod, v.DownwardAPI.Items, modeOr(v.DownwardAPI.DefaultMode), payload); err != nil {
		return err
	}
	dir := m.volumeDir(pod, pluginDownwardAPI, v.Name)
	if err := m.setupTmpfs(pod, dir, nil); err != nil {
		return err
	}
	return m.write(ctx, pod, v.Name, dir, payload)
}

func (m *Manager) setupProjected(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) error {
	mode := modeOr(v.Projected.DefaultMode)
	payload := map[string]file{}
	var errs []error
	for i := range v.Projected.Sources {
		s := &v.Projected.Sources[i]
		switch {
		case s.Secret != nil:
			optional := s.Secret.Optional != nil && *s.Secret.Optional
			if err := m.secretPayload(ctx, pod, s.Secret.Name, s.Secret.Items, mode, optional, payload); err != nil {
				errs = append(errs, err)
			}
		case s.ConfigMap != nil:
			optional := s.ConfigMap.Optional != nil && *s.ConfigMap.Optional
			if err := m.configMapPayload(ctx, pod, s.ConfigMap.Name, s.ConfigMap.Items, mode, optional, payload); err != nil {
				errs = append(errs, err)
			}
		case s.DownwardAPI != nil:
			if err := m.downwardPayload(pod, s.DownwardAPI.Items, mode, payload); err != nil {
				errs = append(errs, err)
			}
		case s.ServiceAccountToken != nil:
			if err := m.tokenPayload(ctx, pod, s.ServiceAccountToken, mode, payload); err != nil {
				errs = append(errs, err)
			}
		case s.ClusterTrustBundle != nil:
			if err := m.trustBundlePayload(ctx, pod, s.ClusterTrustBundle, mode, payload); err != nil {
				errs = append(errs, err)
			}
		case s.PodCertificate != nil:
			if err := m.podCertificatePayload(ctx, pod, v.Name, i, s.PodCertificate, mode, payload); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := aggregate(errs); err != nil {
		return err
	}
	dir := m.volumeDir(pod, pluginProjected, v.Name)
	if err := m.setupTmpfs(pod, dir, nil); err != nil {
		return err
	}
	return m.write(ctx, pod, v.Name, dir, payload)
}

// tokenPayload requests (or reuses) the bound token as the kubelet's projected
// plugin does: audience as given (none means the API server's), the pod as the
// bound object, mode 0600 when an fsGroup will widen it to 0640.
func (m *Manager) tokenPayload(ctx context.Context, pod *corev1.Pod, tp *corev1.ServiceAccountTokenProjection, mode int32, payload map[string]file) error {
	src, err := m.sources()
	if err != nil {
		return err
	}
	if fsGroup(pod) != nil {
		mode = 0o600
	}
	exp := tp.ExpirationSeconds
	if exp == nil {
		d := int64(defaultExpirationSeconds)
		exp = &d
	}
	var auds []string
	if tp.Audience != "" {
		auds = []string{tp.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         auds,
		ExpirationSeconds: exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	tr, err := m.tokens.get(ctx, src, pod.Namespace, sa, req)
	if err != nil {
		return err
	}
	payload[tp.Path] = file{data: []byte(tr.Status.Token), mode: os.FileMode(mode)}
	return nil
}

// trustBundlePayload writes the certificates of the ClusterTrustBundles the
// source names, as the kubelet's projected plugin does: by name or by signer and
// selector, empty when optional and nothing matches, mode 0600 when an fsGroup
// will widen it to 0640.
func (m *Manager) trustBundlePayload(ctx context.Context, pod *corev1.Pod, s *corev1.ClusterTrustBundleProjection, mode int32, payload map[string]file) error {
	ta := m.cfg.TrustAnchors
	if ta == nil {
		return errors.New("ClusterTrustBundle projection is not supported in static kubelet mode")
	}
	optional := s.Optional != nil && *s.Optional
	var data []byte
	var err error
	switch {
	case s.Name != nil:
		data, err = ta.TrustAnchorsByName(ctx, *s.Name, optional)
	case s.SignerName != nil:
		data, err = ta.TrustAnchorsBySigner(ctx, *s.SignerName, s.LabelSelector, optional)
	default:
		err = errors.New("ClusterTrustBundle projection requires either name or signerName to be set")
	}
	if err != nil {
		return err
	}
	if fsGroup(pod) != nil {
		mode = 0o600
	}
	payload[s.Path] = file{data: data, mode: os.FileMode(mode)}
	return nil
}

// podCertificatePayload writes the pod's key and certificate chain (as a
// credential bundle, key first, and/or as separate files), as the kubelet's
// projected plugin does; mode 0600 when an fsGroup will widen it to 0640.
func (m *Manager) podCertificatePayload(ctx context.Context, pod *corev1.Pod, volume string, index int, s *corev1.PodCertificateProjection, mode int32, payload map[string]file) error {
	pc := m.cfg.PodCertificates
	if pc == nil {
		return errors.New("podCertificate projection is not supported without an API server")
	}
	key, chain, err := pc.CredentialBundle(ctx, pod, volume, index, s)
	if err != nil {
		return err
	}
	if fsGroup(pod) != nil {
		mode = 0o600
	}
	if s.CredentialBundlePath != "" {
		bundle := append(append([]byte{}, key...), chain...)
		payload[s.CredentialBundlePath] = file{data: bundle, mode: os.FileMode(mode)}
	}
	if s.KeyPath != "" {
		payload[s.KeyPath] = file{data: key, mode: os.FileMode(mode)}
	}
	if s.CertificateChainPath != "" {
		payload[s.CertificateChainPath] = file{data: chain, mode: os.FileMode(mode)}
	}
	return nil
}

func fsGroup(pod *corev1.Pod) *int64 {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	return pod.Spec.SecurityContext.FSGroup
}

// write runs the atomic writer and applies the fsGroup to what it wrote.
func (m *Manager) write(ctx context.Context, pod *corev1.Pod, volume, dir string, payload map[string]file) error {
	changed, err := writeAtomic(dir, payload, m.cfg.Clock.Now(), func(tsDir string) error {
		return setOwnership(tsDir, fsGroup(pod), true)
	})
	if err != nil {
		return err
	}
	if changed {
		logr.FromContextOrDiscard(ctx).V(4).Info("Volume contents updated", "volume", volume, "path", dir)
	}
	return nil
}

// setOwnership is the kubelet's SetVolumeOwnership for an fsGroup: every file
// and folder gets the group, files gain group read (and write unless readOnly),
// folders gain setgid and group search. Symlinks are left alone. No fsGroup, no
// change.
func setOwnership(dir string, gid *int64, readOnly bool) error {
	if gid == nil {
		return nil
	}
	mask := os.FileMode(0o660)
	if readOnly {
		mask = 0o440
	}
	return filepath.Walk(dir, func(path string, info fs.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			return nil
		}
		if err := os.Lchown(path, -1, int(*gid)); err != nil {
			return err
		}
		m := mask
		if info.IsDir() {
			m |= os.ModeSetgid | 0o110
		}
		return os.Chmod(path, info.Mode()|m)
	})
}
