package main

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodekit-dev/nodekit/podsync"
)

// podRequests is a pod's effective request of resource r, as the scheduler and the
// kubelet's admission compute it: the larger of the app containers plus sidecars and
// any single init container (plus the sidecars started before it), plus overhead.
func podRequests(pod *corev1.Pod, r corev1.ResourceName) int64 {
	val := func(c *corev1.Container) int64 {
		q, ok := c.Resources.Requests[r]
		if !ok {
			return 0
		}
		if r == corev1.ResourceCPU {
			return q.MilliValue()
		}
		return q.Value()
	}
	var apps, sidecars, initMax int64
	for i := range pod.Spec.Containers {
		apps += val(&pod.Spec.Containers[i])
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if podsync.IsRestartableInitContainer(c) {
			sidecars += val(c)
			initMax = max(initMax, sidecars)
			continue
		}
		initMax = max(initMax, sidecars+val(c))
	}
	total := max(apps+sidecars, initMax)
	if q, ok := pod.Spec.Overhead[r]; ok {
		if r == corev1.ResourceCPU {
			total += q.MilliValue()
		} else {
			total += q.Value()
		}
	}
	return total
}

// admit checks a new pod against the node's allocatable and the pods already
// admitted, as the kubelet's predicate admit handler does. A rejection carries the
// kubelet's reason (OutOfcpu, OutOfmemory, OutOfpods, ...) and message.
func (m *podManager) admit(pod *corev1.Pod) (reason, message string, ok bool) {
	// A pod already running here was admitted before this kubelet (re)started: it
	// stays, whatever order the pods come back in.
	if pod.Status.Phase == corev1.PodRunning {
		return "", "", true
	}
	// The kubelet's sysctl admit handler runs before its resource predicates.
	if reason, msg, ok := m.sysctls.admit(pod); !ok {
		return reason, msg, false
	}
	return m.fits(pod)
}

// fits checks pod's requests against the node's allocatable and the other
// admitted pods' allocated requests: the predicate admit handler, for a new pod
// and for a resize alike.
func (m *podManager) fits(pod *corev1.Pod) (reason, message string, ok bool) {
	alloc := m.cfg.node.allocatable()
	m.mu.Lock()
	var others []*corev1.Pod
	for _, e := range m.pods {
		if e.admitted && e.pod.UID != pod.UID && e.pod.Status.Phase != corev1.PodSucceeded && e.pod.Status.Phase != corev1.PodFailed {
			allocated, _ := m.alloc.pod(e.pod)
			others = append(others, allocated)
		}
	}
	m.mu.Unlock()
	if q, ok := alloc[corev1.ResourcePods]; ok && int64(len(others))+1 > q.Value() {
		return "OutOfpods", fmt.Sprintf("Node didn't have enough resource: pods, requested: 1, used: %d, capacity: %d", len(others), q.Value()), false
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		req := podRequests(pod, r)
		if req == 0 {
			continue
		}
		capQ, ok := alloc[r]
		if !ok {
			continue
		}
		capacity := quantityValue(capQ, r)
		var used int64
		for _, o := range others {
			used += podRequests(o, r)
		}
		if req+used > capacity {
			return "OutOf" + string(r), fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d", r, req, used, capacity), false
		}
	}
	return "", "", true
}

func quantityValue(q resource.Quantity, r corev1.ResourceName) int64 {
	if r == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}
