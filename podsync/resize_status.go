package podsync

import (
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// resizeConditions are the conditions of an in-place resize. The agent owns
// them (StatusInput.ResizeConditions); old copies in pod.Status are dropped.
var resizeConditions = map[corev1.PodConditionType]bool{
	corev1.PodResizePending:    true,
	corev1.PodResizeInProgress: true,
}

// The kubelet's limits below which a cgroup value no longer says what was
// asked (pkg/kubelet/cm): 2 shares and a 1 ms quota over 100 ms.
const (
	statusMinShares        = 2
	statusMinMilliCPULimit = 10
)

// setResourceStatuses fills containerStatuses[].allocatedResources (the
// allocated requests, which pod's spec holds) and .resources (what the
// container runs with: the runtime's report for a running container, the
// allocated resources otherwise), as generateAPIPodStatus does with
// InPlacePodVerticalScaling (GA).
func setResourceStatuses(pod *corev1.Pod, view *PodView, statuses, old []corev1.ContainerStatus, specs []corev1.Container) {
	for i := range statuses {
		st := &statuses[i]
		spec := containerSpec(specs, st.Name)
		if spec == nil {
			continue
		}
		st.AllocatedResources = spec.Resources.Requests
		st.Resources = containerStatusResources(spec, st, runtimeStatus(view, st.ContainerID), old)
	}
}

func containerSpec(specs []corev1.Container, name string) *corev1.Container {
	for i := range specs {
		if specs[i].Name == name {
			return &specs[i]
		}
	}
	return nil
}

// runtimeStatus finds the runtime's status of the container an API status
// names ("containerd://<id>").
func runtimeStatus(view *PodView, containerID string) *runtimeapi.ContainerStatus {
	_, id, ok := strings.Cut(containerID, "://")
	if view == nil || !ok || id == "" {
		return nil
	}
	for _, c := range view.Containers {
		if c.GetId() == id {
			return c
		}
	}
	return nil
}

// reportedResources is toKubeContainerResources: the cpu limit, cpu request
// and memory limit the runtime reports, nil where it reports none.
func reportedResources(c *runtimeapi.ContainerStatus) (cpuLimit, cpuRequest, memLimit *resource.Quantity) {
	lr := c.GetResources().GetLinux()
	if lr == nil {
		return nil, nil, nil
	}
	if lr.GetCpuPeriod() > 0 && lr.GetCpuQuota() != -1 {
		if milli := lr.GetCpuQuota() * 1000 / lr.GetCpuPeriod(); milli > 0 {
			cpuLimit = resource.NewMilliQuantity(milli, resource.DecimalSI)
		}
	}
	if shares := lr.GetCpuShares(); shares >= statusMinShares {
		if milli := int64(math.Ceil(float64(shares*1000) / 1024)); milli > 0 {
			cpuRequest = resource.NewMilliQuantity(milli, resource.DecimalSI)
		}
	}
	if lr.GetMemoryLimitInBytes() > 0 {
		memLimit = resource.NewQuantity(lr.GetMemoryLimitInBytes(), resource.BinarySI)
	}
	return cpuLimit, cpuRequest, memLimit
}

// containerStatusResources is convertContainerStatusResources: the allocated
// resources, with the runtime's values in place of cpu and memory for a
// running container; where the runtime reports nothing, the values the same
// running container showed before. Values at or below what a cgroup can
// express keep the allocated ones, so 1m does not turn into 2m.
func containerStatusResources(spec *corev1.Container, st *corev1.ContainerStatus, c *runtimeapi.ContainerStatus, old []corev1.ContainerStatus) *corev1.ResourceRequirements {
	res := spec.Resources.DeepCopy()
	if st.State.Running == nil || c == nil {
		return res
	}
	var prev *corev1.ResourceRequirements
	for i := range old {
		if old[i].Name == st.Name && old[i].State.Running != nil && old[i].ContainerID == st.ContainerID {
			prev = old[i].Resources
		}
	}
	keep := func(name corev1.ResourceName, from, to corev1.ResourceList) {
		if from == nil {
			return
		}
		if q, ok := from[name]; ok {
			to[name] = q.DeepCopy()
		}
	}
	if prev == nil {
		prev = &corev1.ResourceRequirements{}
	}
	cpuLimit, cpuRequest, memLimit := reportedResources(c)
	if res.Limits != nil {
		switch {
		case cpuLimit != nil:
			if cpuLimit.MilliValue() > statusMinMilliCPULimit || res.Limits.Cpu().MilliValue() > statusMinMilliCPULimit {
				res.Limits[corev1.ResourceCPU] = cpuLimit.DeepCopy()
			}
		default:
			keep(corev1.ResourceCPU, prev.Limits, res.Limits)
		}
		if memLimit != nil {
			res.Limits[corev1.ResourceMemory] = memLimit.DeepCopy()
		} else {
			keep(corev1.ResourceMemory, prev.Limits, res.Limits)
		}
	}
	if res.Requests != nil {
		switch {
		case cpuRequest != nil:
			if cpuRequest.MilliValue() > statusMinShares || res.Requests.Cpu().MilliValue() > statusMinShares {
				res.Requests[corev1.ResourceCPU] = cpuRequest.DeepCopy()
			}
		default:
			keep(corev1.ResourceCPU, prev.Requests, res.Requests)
		}
		// The runtime never reports a memory request: the allocated one stays
		// (upstream fills it from the actuated record, which equals it once the
		// resize is done).
	}
	return res
}
