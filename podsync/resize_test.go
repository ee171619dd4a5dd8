package podsync

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func resources(cpuReq, cpuLim, memReq, memLim string) corev1.ResourceRequirements {
	var r corev1.ResourceRequirements
	set := func(l *corev1.ResourceList, name corev1.ResourceName, v string) {
		if v == "" {
			return
		}
		if *l == nil {
			*l = corev1.ResourceList{}
		}
		(*l)[name] = resource.MustParse(v)
	}
	set(&r.Requests, corev1.ResourceCPU, cpuReq)
	set(&r.Limits, corev1.ResourceCPU, cpuLim)
	set(&r.Requests, corev1.ResourceMemory, memReq)
	set(&r.Limits, corev1.ResourceMemory, memLim)
	return r
}

// updateNames lists, per resource, the containers to update in order.
func updateNames(a Actions) map[corev1.ResourceName][]string {
	out := map[corev1.ResourceName][]string{}
	for name, list := range a.ContainersToUpdate {
		for _, u := range list {
			out[name] = append(out[name], u.Container.Name)
		}
	}
	return out
}

func TestComputeActionsResize(t *testing.T) {
	// app and side both run; actuated says what they run with.
	running2 := view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running})
	base := map[string]corev1.ResourceRequirements{
		"app":  resources("100m", "", "64Mi", "128Mi"),
		"side": resources("100m", "200m", "64Mi", ""),
	}
	withResources := func(app, side corev1.ResourceRequirements) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.Containers[0].Resources, p.Spec.Containers[1].Resources = app, side }
	}
	restartMemory := func(p *corev1.Pod) {
		p.Spec.Containers[0].ResizePolicy = []corev1.ContainerResizePolicy{
			{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
			{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer},
		}
	}
	tests := []struct {
		name        string
		pod         *corev1.Pod
		view        *PodView
		actuated    map[string]corev1.ResourceRequirements
		noActuated  bool
		wantUpdates map[corev1.ResourceName][]string
		wantKill    []string
		wantKillMsg string
		wantStart   []int
		wantPodRes  bool
	}{{
		name:        "allocated equals actuated: nothing to resize",
		pod:         testPod(withResources(base["app"], base["side"])),
		view:        running2,
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{},
	}, {
		name:        "cpu request up, limit added: one cpu update, no restart",
		pod:         testPod(withResources(resources("200m", "400m", "64Mi", "128Mi"), base["side"])),
		view:        running2,
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{corev1.ResourceCPU: {"app"}},
	}, {
		name:        "memory up on app, down on side: the decrease goes first",
		pod:         testPod(withResources(resources("100m", "", "64Mi", "256Mi"), resources("100m", "200m", "32Mi", ""))),
		view:        running2,
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{corev1.ResourceMemory: {"side", "app"}},
	}, {
		name:        "cpu down on app and up on side, memory request only on side",
		pod:         testPod(withResources(resources("50m", "", "64Mi", "128Mi"), resources("150m", "200m", "32Mi", ""))),
		view:        running2,
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{corev1.ResourceCPU: {"app", "side"}, corev1.ResourceMemory: {"side"}},
	}, {
		name:        "resizePolicy RestartContainer for memory: killed and started again, pod cgroup resized",
		pod:         testPod(withResources(resources("100m", "", "64Mi", "256Mi"), base["side"]), restartMemory),
		view:        running2,
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{},
		wantKill:    []string{"app"},
		wantKillMsg: "Container app resize requires restart",
		wantStart:   []int{0},
		wantPodRes:  true,
	}, {
		name:        "RestartContainer for memory but only cpu changed: updated in place",
		pod:         testPod(withResources(resources("300m", "", "64Mi", "128Mi"), base["side"]), restartMemory),
		view:        running2,
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{corev1.ResourceCPU: {"app"}},
	}, {
		name:        "a container that is not running is not resized",
		pod:         testPod(withResources(resources("200m", "", "64Mi", "128Mi"), base["side"])),
		view:        view(ready(), cs{name: "app", id: "a1", state: exited, exit: 1}, cs{name: "side", id: "s1", state: running}),
		actuated:    base,
		wantUpdates: map[corev1.ResourceName][]string{},
		wantStart:   []int{0},
		wantPodRes:  true, // it restarts with other resources than it ran with
	}, {
		name:        "no actuated state given: no resize computed",
		pod:         testPod(withResources(resources("200m", "", "64Mi", "128Mi"), base["side"])),
		view:        running2,
		noActuated:  true,
		wantUpdates: map[corev1.ResourceName][]string{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := ActionOptions{}
			if !tt.noActuated {
				opts.Actuated = func(name string) (corev1.ResourceRequirements, bool) {
					r, ok := tt.actuated[name]
					return r, ok
				}
			}
			got := ComputeActions(tt.pod, tt.view, opts)
			assert.Equal(t, tt.wantUpdates, updateNames(got))
			var killed []string
			for _, k := range got.ContainersToKill {
				killed = append(killed, k.Name)
				if tt.wantKillMsg != "" {
					assert.Equal(t, tt.wantKillMsg, k.Message)
				}
			}
			assert.Equal(t, tt.wantKill, killed)
			assert.Equal(t, tt.wantStart, got.ContainersToStart)
			assert.Equal(t, tt.wantPodRes, got.UpdatePodResources)
			assert.False(t, got.KillPod)
		})
	}
}

func TestResizeUpdateCarriesBothResources(t *testing.T) {
	// One container changes cpu and memory: two updates sharing the current
	// values, so the second carries what the first applied.
	pod := testPod(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = resources("200m", "", "64Mi", "256Mi") })
	got := ComputeActions(pod, view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running}),
		ActionOptions{Actuated: func(name string) (corev1.ResourceRequirements, bool) {
			if name == "app" {
				return resources("100m", "", "64Mi", "128Mi"), true
			}
			return corev1.ResourceRequirements{}, true
		}})
	mem, cpu := got.ContainersToUpdate[corev1.ResourceMemory], got.ContainersToUpdate[corev1.ResourceCPU]
	if assert.Len(t, mem, 1) && assert.Len(t, cpu, 1) {
		assert.Same(t, mem[0].Current, cpu[0].Current)
		assert.Equal(t, ResourceValues{MemoryLimit: 256 << 20, MemoryRequest: 64 << 20, CPURequest: 200}, mem[0].Desired)
		assert.Equal(t, "a1", mem[0].ContainerID)
	}
}

func TestComputeActionsResizeSidecar(t *testing.T) {
	sidecarResources := func(r corev1.ResourceRequirements, policy corev1.ResourceResizeRestartPolicy) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.InitContainers[0].Resources = r
			p.Spec.InitContainers[0].ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceCPU, RestartPolicy: policy}}
		}
	}
	v := view(ready(), cs{name: "sc", id: "sc1", state: running}, cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running})
	actuated := func(name string) (corev1.ResourceRequirements, bool) {
		if name == "sc" {
			return resources("100m", "", "", ""), true
		}
		return corev1.ResourceRequirements{}, true
	}

	got := ComputeActions(testPod(withSidecar("sc"), sidecarResources(resources("200m", "", "", ""), corev1.NotRequired)), v, ActionOptions{Actuated: actuated})
	assert.Equal(t, map[corev1.ResourceName][]string{corev1.ResourceCPU: {"sc"}}, updateNames(got))
	assert.Empty(t, got.ContainersToKill)
	assert.Empty(t, got.InitContainersToStart)

	got = ComputeActions(testPod(withSidecar("sc"), sidecarResources(resources("200m", "", "", ""), corev1.RestartContainer)), v, ActionOptions{Actuated: actuated})
	assert.Empty(t, got.ContainersToUpdate)
	if assert.Len(t, got.ContainersToKill, 1) {
		assert.Equal(t, "Container sc resize requires restart", got.ContainersToKill[0].Message)
	}
	assert.Equal(t, []int{0}, got.InitContainersToStart)
	assert.True(t, got.UpdatePodResources)
}
