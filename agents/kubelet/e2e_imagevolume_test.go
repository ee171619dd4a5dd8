package main_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

func imageVolumePod(name, image, reference string, policy corev1.PullPolicy, mounts ...corev1.VolumeMount) *corev1.Pod {
	p := busyboxPod(name, image, corev1.RestartPolicyAlways, "sleep 3600")
	p.Spec.Containers[0].VolumeMounts = mounts
	p.Spec.Volumes = []corev1.Volume{{Name: "image", VolumeSource: corev1.VolumeSource{
		Image: &corev1.ImageVolumeSource{Reference: reference, PullPolicy: policy}}}}
	return p
}

func waitingReason(p *corev1.Pod, container string) string {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container && s.State.Waiting != nil {
			return s.State.Waiting.Reason
		}
	}
	return ""
}

// TestKubeletImageVolumes runs image volumes (pod.spec.volumes[].image) on a real
// node whose containerd is 2.x (hack/build-containerd.sh), as the ImageVolume
// conformance spec uses them: the image is made present as the kubelet makes it
// (events about the pod), mounted read-only by the runtime, whole or a subPath of
// it; a volume whose pull fails holds back only the containers that mount it. On
// the machine's containerd 1.6, which cannot mount images, the container waits
// with CreateContainerConfigError naming the cause.
func TestKubeletImageVolumes(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	v2 := containerd.V2Dir(t)
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNodeOn(t, cp, "nk-node-imgvol", true, "", v2)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	require.True(t, strings.HasPrefix(n.runtime.RuntimeVersion().GetRuntimeVersion(), "v2."), n.runtime.RuntimeVersion().GetRuntimeVersion())
	image := n.ctd.BusyboxImage()

	t.Run("mounted read-only, whole and by subPath", func(t *testing.T) {
		p := n.createPod(t, imageVolumePod("imgvol", image, image, corev1.PullIfNotPresent,
			corev1.VolumeMount{Name: "image", MountPath: "/volume"},
			corev1.VolumeMount{Name: "image", MountPath: "/tools", SubPath: "bin"}))
		got := n.waitPod(t, p.Name, 90*time.Second, "running", podReady)
		root, code := n.exec(t, got, "ls", "/volume")
		require.Equal(t, 0, code)
		assert.Contains(t, strings.Fields(root), "etc", "the image's root is at the mount path")
		tools, code := n.exec(t, got, "ls", "/tools")
		require.Equal(t, 0, code)
		assert.Contains(t, strings.Fields(tools), "sh", "subPath bin is the image's /bin")
		_, code = n.exec(t, got, "touch", "/volume/new")
		assert.NotEqual(t, 0, code, "an image volume is read-only")

		var podLevel []string
		for _, e := range n.events(t, p.Name) {
			if e.InvolvedObject.FieldPath == "" && e.Reason == "Pulled" {
				podLevel = append(podLevel, e.Message)
			}
		}
		assert.Equal(t, []string{`Container image "` + image + `" already present on machine`}, podLevel,
			"the volume's image check is an event about the pod, as the kubelet records it")
	})

	t.Run("a failed pull holds back only the containers that mount it", func(t *testing.T) {
		// Nothing listens on port 1 of the node namespace's loopback: the pull fails
		// at once and nothing leaves the namespace.
		const ref = "127.0.0.1:1/absent:1"
		p := imageVolumePod("imgvol-missing", image, ref, corev1.PullIfNotPresent, corev1.VolumeMount{Name: "image", MountPath: "/volume"})
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "plain", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sleep", "3600"}})
		n.createPod(t, p)
		got := n.waitPod(t, p.Name, 90*time.Second, "main waiting on the image, plain running", func(p *corev1.Pod) bool {
			plainRunning := false
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == "plain" && s.State.Running != nil {
					plainRunning = true
				}
			}
			r := waitingReason(p, "main")
			return plainRunning && (r == "ErrImagePull" || r == "ImagePullBackOff")
		})
		assert.Equal(t, corev1.PodPending, got.Status.Phase)
		events := n.events(t, p.Name)
		assert.True(t, hasEvent(events, "Pulling", `Pulling image "`+ref+`"`), "%v", events)
		assert.True(t, hasEvent(events, "Failed", `Failed to pull image "`+ref+`"`), "%v", events)
		assert.True(t, hasEvent(events, "Failed", "Error: ErrImagePull"), "%v", events)
	})

	t.Run("containerd 1.6 cannot mount images: CreateContainerConfigError", func(t *testing.T) {
		old := startNodeOn(t, cp, "nk-node-imgvol-old", true, "", "")
		old.waitReady(t, corev1.ConditionTrue, 60*time.Second)
		if v := old.runtime.RuntimeVersion().GetRuntimeVersion(); !strings.HasPrefix(v, "1.") {
			t.Skipf("the machine's containerd is %s", v)
		}
		p := imageVolumePod("imgvol-old", image, image, corev1.PullIfNotPresent, corev1.VolumeMount{Name: "image", MountPath: "/volume"})
		old.createPod(t, p)
		got := old.waitPod(t, p.Name, 60*time.Second, "waiting with CreateContainerConfigError", func(p *corev1.Pod) bool {
			return waitingReason(p, "main") == "CreateContainerConfigError"
		})
		msg := got.Status.ContainerStatuses[0].State.Waiting.Message
		assert.Contains(t, msg, `image volume "image" (`+image+`) cannot be mounted into container "main": the container runtime containerd 1.6`)
		assert.Contains(t, msg, "CRI image mounts need containerd 2.1 or later")
		assert.True(t, hasEvent(old.events(t, p.Name), "Failed", "cannot mount images"))
	})
}
