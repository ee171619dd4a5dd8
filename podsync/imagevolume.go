package podsync

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageVolumePull is the outcome of pulling one image volume's image: the spec
// its CRI mounts carry, or the pull failure (reason and message as for a
// container's image).
type imageVolumePull struct {
	spec *runtimeapi.ImageSpec
	err  error
}

// pullImageVolumes is the kubelet's getImageVolumes (kuberuntime_manager.go,
// v1.37.2): every image volume of the pod is made present with its own pull
// policy, through the same ensureImage as containers' images (pull back-off,
// credentials, Pulling/Pulled events), the events recorded against the pod
// itself. A failure is kept per volume and reported by each container that
// mounts it; the other containers still start.
func (s *Syncer) pullImageVolumes(ctx context.Context, pod *corev1.Pod, sbCfg *runtimeapi.PodSandboxConfig) map[string]imageVolumePull {
	var out map[string]imageVolumePull
	podRef := &corev1.ObjectReference{
		Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		ResourceVersion: pod.ResourceVersion,
	}
	for _, v := range pod.Spec.Volumes {
		if v.Image == nil {
			continue
		}
		if out == nil {
			out = map[string]imageVolumePull{}
		}
		what := fmt.Sprintf("image volume %q of pod %s", v.Name, formatPod(pod))
		ref, err := s.ensureImage(ctx, pod, v.Image.Reference, pullPolicy(v.Image.Reference, v.Image.PullPolicy), podRef, what, sbCfg)
		if err != nil {
			out[v.Name] = imageVolumePull{err: err}
			continue
		}
		out[v.Name] = imageVolumePull{spec: &runtimeapi.ImageSpec{
			Image:              ref,
			UserSpecifiedImage: v.Image.Reference,
			RuntimeHandler:     s.cfg.RuntimeHandler,
			Annotations:        pod.Annotations,
		}}
	}
	return out
}

// imageVolumeFailure is the kubelet's toKubeContainerImageVolumes for a
// container: a Failed event for each image volume it mounts whose pull failed,
// and the last such failure as the container's start error (its waiting reason
// is then the pull's: ErrImagePull, ImagePullBackOff, ...).
func (s *Syncer) imageVolumeFailure(ctr *corev1.Container, ref *corev1.ObjectReference, pulls map[string]imageVolumePull) error {
	var last error
	for _, vm := range ctr.VolumeMounts {
		if p, ok := pulls[vm.Name]; ok && p.err != nil {
			s.event(ref, corev1.EventTypeWarning, EventFailed, "Error: %v", Reason(p.err))
			last = p.err
		}
	}
	return last
}

// resolveImageMounts gives each CRI mount of an image volume the spec of the
// image pulled for it. The ConfigBuilder (volume.Manager.Mounts) names the image
// as the pod spec does; the mount of a volume not pulled here is left alone.
func resolveImageMounts(cfg *runtimeapi.ContainerConfig, ctr *corev1.Container, pulls map[string]imageVolumePull) {
	if len(pulls) == 0 {
		return
	}
	byRef := map[string]*runtimeapi.ImageSpec{}
	for _, vm := range ctr.VolumeMounts {
		p, ok := pulls[vm.Name]
		if !ok || p.spec == nil {
			continue
		}
		byRef[p.spec.UserSpecifiedImage] = p.spec
	}
	for _, m := range cfg.GetMounts() {
		if m.GetImage() == nil {
			continue
		}
		if spec, ok := byRef[m.GetImage().GetUserSpecifiedImage()]; ok {
			m.Image = spec
		}
	}
}
