package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/downward"
)

// mountError keeps the kubelet's message while wrapping a sentinel.
type mountError struct {
	msg  string
	kind error
	err  error
}

func (e *mountError) Error() string { return e.msg }
func (e *mountError) Unwrap() []error {
	if e.err != nil {
		return []error{e.kind, e.err}
	}
	return []error{e.kind}
}

// Mounts returns the CRI mounts for container's volumeMounts, in their order, as
// the kubelet's makeMounts computes them (without the /etc/hosts mount, which is
// the agent's). subPathExpr is expanded against env (the container's environment,
// as podenv computes it); env may be left out when no mount uses subPathExpr.
//
// A subPath is resolved inside its volume with openat2(RESOLVE_BENEATH), so no
// symlink or ".." leads out of it; a missing subPath is created as a folder with
// the volume's mode. With a mounting Mounter the resolved path is pinned with a
// bind mount under <pod>/volume-subpaths/<volume>/<container>/<index> (as the
// kubelet does), so a container that later swaps a folder for a symlink changes
// nothing; with NoMount the resolved path itself is returned.
//
// An image volume's mount has no HostPath but an Image whose Image and
// UserSpecifiedImage are the volume's reference, read-only, with the subPath in
// ImageSubPath for the runtime to resolve inside the image, as the kubelet's
// makeMounts makes it. The caller replaces Image with the spec of the image it
// pulled (podsync does) before CreateContainer.
func (m *Manager) Mounts(pod *corev1.Pod, container *corev1.Container, env ...*runtimeapi.KeyValue) ([]*runtimeapi.Mount, error) {
	if pod == nil || container == nil {
		return nil, fmt.Errorf("%w: nil pod or container", ErrInvalidPod)
	}
	if err := checkUID(pod.UID); err != nil {
		return nil, err
	}
	unlock := m.lockPod(pod.UID)
	defer unlock()

	vols := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		vols[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	envMap := map[string]string{}
	for _, kv := range env {
		if kv != nil {
			envMap[kv.Key] = string(kv.Value)
		}
	}
	var out []*runtimeapi.Mount
	for i, vm := range container.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			return nil, &mountError{msg: fmt.Sprintf("cannot find volume %q to mount into container %q", vm.Name, container.Name), kind: ErrInvalidPod}
		}
		var (
			hostPath         string
			forceRO, managed bool
			image            *runtimeapi.ImageSpec
			err              error
		)
		if v.Image != nil {
			// The runtime mounts the image: no host path, always read-only, no
			// relabelling (upstream's image plugin attributes).
			image, forceRO = &runtimeapi.ImageSpec{Image: v.Image.Reference, UserSpecifiedImage: v.Image.Reference}, true
		} else if hostPath, forceRO, managed, err = m.hostPath(pod, v); err != nil {
			return nil, err
		}
		subPath := vm.SubPath
		if vm.SubPathExpr != "" {
			if subPath, err = expandSubPath(vm.SubPathExpr, envMap); err != nil {
				return nil, err
			}
		}
		var imageSubPath string
		if subPath != "" {
			if filepath.IsAbs(subPath) {
				return nil, &mountError{msg: fmt.Sprintf("error SubPath `%s` must not be an absolute path", subPath), kind: ErrInvalidSubPath}
			}
			if hasBackstep(subPath) {
				return nil, &mountError{msg: fmt.Sprintf("unable to provision SubPath `%s`: must not contain '..'", subPath), kind: ErrInvalidSubPath}
			}
			if image != nil {
				// Resolved by the runtime inside the image's root, which it
				// checks exists (the kubelet makes nothing for it).
				imageSubPath = subPath
			} else if hostPath, err = m.subPath(pod, container.Name, i, v.Name, hostPath, subPath); err != nil {
				return nil, err
			}
		}
		prop, err := propagation(vm.MountPropagation)
		if err != nil {
			return nil, err
		}
		rro, err := m.recursiveReadOnly(vm)
		if err != nil {
			return nil, &mountError{msg: "failed to resolve recursive read-only mode: " + err.Error(), kind: ErrInvalidPod, err: err}
		}
		out = append(out, &runtimeapi.Mount{
			ContainerPath:     filepath.Clean("/" + vm.MountPath),
			HostPath:          hostPath,
			Readonly:          vm.ReadOnly || forceRO,
			RecursiveReadOnly: rro,
			SelinuxRelabel:    managed,
			Propagation:       prop,
			Image:             image,
			ImageSubPath:      imageSubPath,
		})
	}
	return out, nil
}

// hostPath is where a volume lives on the node. forceRO is the plugin's
// read-only attribute; managed says the kubelet owns the folder (and relabels it).
func (m *Manager) hostPath(pod *corev1.Pod, v *corev1.Volume) (path string, forceRO, managed bool, err error) {
	var plugin string
	switch {
	case v.HostPath != nil:
		return v.HostPath.Path, false, false, nil
	case v.EmptyDir != nil:
		plugin = pluginEmptyDir
	case v.ConfigMap != nil:
		plugin, forceRO = pluginConfigMap, true
	case v.Secret != nil:
		plugin, forceRO = pluginSecret, true
	case v.DownwardAPI != nil:
		plugin, forceRO = pluginDownwardAPI, true
	case v.Projected != nil:
		plugin, forceRO = pluginProjected, true
	default:
		return "", false, false, &UnsupportedError{Volume: v.Name, Type: volumeType(&v.VolumeSource)}
	}
	dir := m.volumeDir(pod, plugin, v.Name)
	if _, err := os.Stat(dir); err != nil {
		return "", false, false, &mountError{msg: fmt.Sprintf("volume %q of pod %s/%s is not set up: %v", v.Name, pod.Namespace, pod.Name, err), kind: ErrNotSetUp, err: err}
	}
	return dir, forceRO, true, nil
}

// expandSubPath is the kubelet's ExpandContainerVolumeMounts: every variable must
// be known and non-empty.
func expandSubPath(expr string, env map[string]string) (string, error) {
	missing := map[string]bool{}
	out := downward.Expand(expr, func(name string) (string, bool) {
		v, ok := env[name]
		if !ok || v == "" {
			missing[name] = true
		}
		return v, true
	})
	if len(missing) > 0 {
		names := make([]string, 0, len(missing))
		for n := range missing {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", &mountError{msg: "missing value for " + strings.Join(names, ", "), kind: ErrInvalidSubPath}
	}
	return out, nil
}

func hasBackstep(p string) bool {
	for _, part := range strings.Split(filepath.ToSlash(p), "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

func propagation(mode *corev1.MountPropagationMode) (runtimeapi.MountPropagation, error) {
	switch {
	case mode == nil, *mode == corev1.MountPropagationNone:
		return runtimeapi.MountPropagation_PROPAGATION_PRIVATE, nil
	case *mode == corev1.MountPropagationHostToContainer:
		return runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER, nil
	case *mode == corev1.MountPropagationBidirectional:
		return runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL, nil
	}
	return 0, &mountError{msg: fmt.Sprintf("invalid MountPropagation mode: %q", *mode), kind: ErrInvalidPod}
}

// recursiveReadOnly is the kubelet's resolveRecursiveReadOnly.
func (m *Manager) recursiveReadOnly(vm corev1.VolumeMount) (bool, error) {
	if vm.RecursiveReadOnly == nil || *vm.RecursiveReadOnly == corev1.RecursiveReadOnlyDisabled {
		return false, nil
	}
	if !vm.ReadOnly {
		return false, fmt.Errorf("volume %q requires recursiveReadOnly to be %q if readOnly is false", vm.Name, corev1.RecursiveReadOnlyDisabled)
	}
	if vm.MountPropagation != nil && *vm.MountPropagation != corev1.MountPropagationNone {
		return false, fmt.Errorf("volume %q requires recursiveReadOnly to be %q if mountPropagation is not %q", vm.Name, corev1.RecursiveReadOnlyDisabled, corev1.MountPropagationNone)
	}
	switch rro := *vm.RecursiveReadOnly; rro {
	case corev1.RecursiveReadOnlyIfPossible:
		return m.cfg.RuntimeSupportsRecursiveReadOnly, nil
	case corev1.RecursiveReadOnlyEnabled:
		if !m.cfg.RuntimeSupportsRecursiveReadOnly {
			return false, fmt.Errorf("volume %q requires recursiveReadOnly to be %q, but it is not supported by the runtime", vm.Name, rro)
		}
		return true, nil
	default:
		return false, fmt.Errorf("unknown recursiveReadOnly value %q", rro)
	}
}

// subPath resolves subPath inside volPath and returns the host path to mount.
func (m *Manager) subPath(pod *corev1.Pod, containerName string, index int, volName, volPath, subPath string) (string, error) {
	fail := func(err error) error {
		// The kubelet keeps host details out of the pod's message (it could tell
		// a pod about the node's files); the cause stays wrapped for the logs.
		return &mountError{msg: fmt.Sprintf("failed to prepare subPath for volumeMount %q of container %q", volName, containerName), kind: ErrInvalidSubPath, err: err}
	}
	fd, err := openBeneath(volPath, subPath)
	if err != nil {
		return "", fail(err)
	}
	defer fd.Close()
	resolved, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(fd.Fd())))
	if err != nil {
		return "", fail(err)
	}
	if _, ok := m.cfg.Mounter.(NoMount); ok {
		return resolved, nil
	}
	st, err := fd.Stat()
	if err != nil {
		return "", fail(err)
	}
	target := filepath.Join(m.PodDir(pod.UID), "volume-subpaths", volName, containerName, strconv.Itoa(index))
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return "", fail(err)
	}
	if mps, err := m.cfg.Mounter.MountPoints(target); err != nil {
		return "", fail(err)
	} else {
		for _, mp := range mps {
			if err := m.cfg.Mounter.Unmount(mp); err != nil {
				return "", fail(err)
			}
		}
	}
	if st.IsDir() {
		err = os.MkdirAll(target, 0o750)
	} else {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640); err == nil {
			err = f.Close()
		}
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return "", fail(err)
	}
	// Binding the open descriptor, not the path, is what makes the check stick.
	if err := m.cfg.Mounter.BindMount("/proc/self/fd/"+strconv.Itoa(int(fd.Fd())), target); err != nil {
		return "", fail(err)
	}
	return target, nil
}

// VolumePath returns the host folder of the pod's volume name as Setup made it
// (the host path itself for hostPath), for podenv's fileKeyRef. The volume must
// be set up.
func (m *Manager) VolumePath(pod *corev1.Pod, name string) (string, error) {
	if pod == nil {
		return "", fmt.Errorf("%w: nil pod", ErrInvalidPod)
	}
	if err := checkUID(pod.UID); err != nil {
		return "", err
	}
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			p, _, _, err := m.hostPath(pod, &pod.Spec.Volumes[i])
			return p, err
		}
	}
	return "", fmt.Errorf("%w: pod %s/%s has no volume %q", ErrInvalidPod, pod.Namespace, pod.Name, name)
}
