package podsync_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

func imageVolume(name, ref string, policy corev1.PullPolicy) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: ref, PullPolicy: policy}}}
}

func TestSyncPodImageVolumes(t *testing.T) {
	e := newEnv(t)
	e.rt.SetPullable("registry.example/models:1", true)
	pod := newPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{"team": "ml"}
		p.Spec.Volumes = []corev1.Volume{
			imageVolume("models", "registry.example/models:1", corev1.PullIfNotPresent),
			imageVolume("broken", "registry.example/missing:1", corev1.PullIfNotPresent),
		}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "models", MountPath: "/models", SubPath: "data"}}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "other", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent,
			VolumeMounts: []corev1.VolumeMount{{Name: "broken", MountPath: "/broken"}}})
	})
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrImagePull)
	assert.Contains(t, res.Error().Error(), `image volume "broken" of pod web_default(uid-1)`, "the error names the volume at fault")

	var podEvents, otherEvents []string
	for _, ev := range e.events.Events() {
		switch ev.FieldPath {
		case "":
			podEvents = append(podEvents, ev.String())
		case "spec.containers{other}":
			otherEvents = append(otherEvents, ev.String())
		}
	}
	require.Len(t, podEvents, 4, "image volume pulls are recorded against the pod: %q", podEvents)
	assert.Equal(t, `Normal Pulling Pulling image "registry.example/models:1"`, podEvents[0])
	assert.Equal(t, `Normal Pulled Successfully pulled image "registry.example/models:1" in 0s (0s including waiting). Image size: 25000 bytes.`, podEvents[1])
	assert.Equal(t, `Normal Pulling Pulling image "registry.example/missing:1"`, podEvents[2])
	assert.True(t, strings.HasPrefix(podEvents[3], `Warning Failed Failed to pull image "registry.example/missing:1": rpc error: code = NotFound`), podEvents[3])
	assert.Equal(t, []string{"Warning Failed Error: ErrImagePull"}, otherEvents, "only the container mounting the failed volume fails")

	app := e.running("app")
	require.Len(t, app.Mounts, 1)
	assert.Equal(t, &runtimeapi.ImageSpec{
		Image: podsynctest.ImageRef("registry.example/models:1"), UserSpecifiedImage: "registry.example/models:1",
		Annotations: map[string]string{"team": "ml"},
	}, app.Mounts[0].Image, "the mount carries the pulled image")
	assert.Equal(t, "data", app.Mounts[0].ImageSubPath)
	assert.True(t, app.Mounts[0].Readonly)
	assert.Nil(t, e.rt.ContainerByName("other"), "a container whose image volume failed is not created")
	other := statusOf(t, e.status(pod).ContainerStatuses, "other")
	assert.Equal(t, "ErrImagePull", other.State.Waiting.Reason)
	assert.Contains(t, other.State.Waiting.Message, "not found")

	// The volume's pull backs off like a container image's, then succeeds.
	e.events.Reset()
	require.ErrorIs(t, e.sync(pod).Error(), podsync.ErrImagePullBackOff)
	assert.Contains(t, e.events.Strings(), `Normal BackOff Back-off pulling image "registry.example/missing:1"`)
	assert.Equal(t, "ImagePullBackOff", reasonOf(statusOf(t, e.status(pod).ContainerStatuses, "other")))
	e.rt.SetPullable("registry.example/missing:1", true)
	e.clk.Step(10 * time.Second)
	require.NoError(t, e.sync(pod).Error())
	assert.Equal(t, "registry.example/missing:1", e.running("other").Mounts[0].Image.UserSpecifiedImage)
}

func TestSyncPodImageVolumePullPolicies(t *testing.T) {
	e := newEnv(t)
	e.rt.AddImage("registry.example/present:1", "registry.example/latest:latest")
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{
			imageVolume("always", "registry.example/present:1", corev1.PullAlways),
			imageVolume("defaulted", "registry.example/latest", ""),
			imageVolume("never", "registry.example/absent:1", corev1.PullNever),
		}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "always", MountPath: "/a"}, {Name: "defaulted", MountPath: "/d"}}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "other", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent,
			VolumeMounts: []corev1.VolumeMount{{Name: "never", MountPath: "/n"}}})
	})
	require.ErrorIs(t, e.sync(pod).Error(), podsync.ErrImageNeverPull)
	calls := e.rt.CallNames()
	assert.Contains(t, calls, "PullImage(registry.example/present:1)", "Always pulls an image that is present")
	assert.Contains(t, calls, "PullImage(registry.example/latest:latest)", "no policy and no tag means Always, with the default tag")
	assert.Contains(t, e.events.Strings(), `Warning ErrImageNeverPull Container image "registry.example/absent:1" is not present with pull policy of Never`)
	assert.Len(t, e.running("app").Mounts, 2)
	assert.Equal(t, "ErrImageNeverPull", reasonOf(statusOf(t, e.status(pod).ContainerStatuses, "other")))
}
