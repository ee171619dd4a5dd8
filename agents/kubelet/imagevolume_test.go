package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestImageMountsMissing(t *testing.T) {
	for _, tc := range []struct {
		name, version string
		missing       bool
	}{
		{"containerd", "1.6.20~ds1", true}, // Debian 12
		{"containerd", "v1.7.27", true},
		{"containerd", "v2.0.5", true},
		{"containerd", "v2.1.0", false},
		{"containerd", "v2.4.2", false},
		{"containerd", "v3.0.0", false},
		{"containerd", "devel", false}, // unknown: left to the runtime
		{"cri-o", "1.30.0", false},
	} {
		got := imageMountsMissing(&runtimeapi.VersionResponse{RuntimeName: tc.name, RuntimeVersion: tc.version})
		assert.Equal(t, tc.missing, got != "", "%s %s: %q", tc.name, tc.version, got)
	}
	assert.Equal(t, "the container runtime containerd 1.6.20~ds1 cannot mount images (CRI image mounts need containerd 2.1 or later)",
		imageMountsMissing(&runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "1.6.20~ds1"}))
}

func TestCheckImageMounts(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "models", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.example/models:1"}}},
		},
		Containers: []corev1.Container{
			{Name: "plain", VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/s"}}},
			{Name: "infer", VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/s"}, {Name: "models", MountPath: "/m"}}},
		},
	}}
	old := &configBuilder{noImageMounts: "the container runtime containerd 1.6.20~ds1 cannot mount images"}
	assert.NoError(t, old.checkImageMounts(pod, &pod.Spec.Containers[0]), "a container without image volumes runs anywhere")
	err := old.checkImageMounts(pod, &pod.Spec.Containers[1])
	assert.EqualError(t, err, `image volume "models" (registry.example/models:1) cannot be mounted into container "infer": the container runtime containerd 1.6.20~ds1 cannot mount images`)
	assert.NoError(t, (&configBuilder{}).checkImageMounts(pod, &pod.Spec.Containers[1]), "a runtime that mounts images")
}
