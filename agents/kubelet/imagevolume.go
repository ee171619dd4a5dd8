package main

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageMountsMissing names why the runtime cannot mount image volumes, or ""
// when it can (or is not known not to). CRI carries image mounts in
// Mount.image, a field containerd before 2.1 does not know: it reads such a
// mount as a bind mount of an empty host path and CreateContainer fails with
// `failed to mkdir ""`. The upstream kubelet passes that error on; this kubelet
// names the cause instead.
func imageMountsMissing(v *runtimeapi.VersionResponse) string {
	if v.GetRuntimeName() != "containerd" {
		return ""
	}
	major, minor, ok := majorMinor(v.GetRuntimeVersion())
	if !ok || major > 2 || (major == 2 && minor >= 1) {
		return ""
	}
	return fmt.Sprintf("the container runtime containerd %s cannot mount images (CRI image mounts need containerd 2.1 or later)", v.GetRuntimeVersion())
}

// majorMinor reads "v2.4.2" or Debian's "1.6.20~ds1".
func majorMinor(version string) (major, minor int, ok bool) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return major, minor, err1 == nil && err2 == nil
}

// checkImageMounts fails a container that mounts an image volume when the
// runtime cannot mount images, naming the volume: the container then waits
// with CreateContainerConfigError and this message, and a Failed event says it.
func (b *configBuilder) checkImageMounts(pod *corev1.Pod, c *corev1.Container) error {
	if b.noImageMounts == "" {
		return nil
	}
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == vm.Name && v.Image != nil {
				return fmt.Errorf("image volume %q (%s) cannot be mounted into container %q: %s", v.Name, v.Image.Reference, c.Name, b.noImageMounts)
			}
		}
	}
	return nil
}
