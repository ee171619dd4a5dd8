package main

import (
	"fmt"
	"runtime"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/staticpod"
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
	// The eviction manager's admit handler comes first, as the kubelet adds it first.
	if m.eviction != nil {
		if reason, msg, ok := m.eviction.admit(pod); !ok {
			return reason, msg, false
		}
	}
	// The kubelet's sysctl admit handler runs before its resource predicates.
	if reason, msg, ok := m.sysctls.admit(pod); !ok {
		return reason, msg, false
	}
	return m.fits(pod)
}

// fits runs the kubelet's predicate admit handler, for a new pod and for a resize
// alike: the OS and supplemental-group checks, pod's requests against the node's
// allocatable and the other admitted pods' allocated requests, then affinity,
// node name, host ports and NoExecute taints.
func (m *podManager) fits(pod *corev1.Pod) (reason, message string, ok bool) {
	node := m.cfg.node.admissionNode()
	if reason, msg, ok := admitOnNode(pod, node); !ok {
		return reason, msg, false
	}
	alloc := m.cfg.node.allocatable()
	m.mu.Lock()
	var others []*corev1.Pod
	for _, e := range m.pods {
		// A pod counts once admitted, or, right after a restart, before its
		// worker has admitted it again when the checkpoint holds its allocation
		// (upstream's getAllocatedPods: active pods with an allocation).
		counted := e.admitted || (!e.rejected && m.alloc.has(e.pod.UID))
		if counted && e.pod.UID != pod.UID && e.pod.Status.Phase != corev1.PodSucceeded && e.pod.Status.Phase != corev1.PodFailed {
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
	// Then the rest of the scheduler's admission check, in its order (node affinity,
	// node name, host ports), and the NoExecute taints for all but static pods.
	if match, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); !match {
		return predicateFailed("NodeAffinity", "node(s) didn't match Pod's node affinity/selector")
	}
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != node.Name {
		return predicateFailed("NodeName", "node(s) didn't match the requested node name")
	}
	if conflict := hostPortConflict(pod, others); conflict {
		return predicateFailed("NodePorts", "node(s) didn't have free ports for the requested pod ports")
	}
	if !isStatic(pod) {
		noExecute := func(t *corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoExecute }
		// TaintTolerationComparisonOperators is alpha and off in 1.37.
		if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations, noExecute, false); untolerated {
			return predicateFailed("TaintToleration", "node(s) had taints that the pod didn't tolerate")
		}
	}
	return "", "", true
}

// admitOnNode is the kubelet's checks before its general predicates: the pod's
// kubernetes.io/os label and spec.os against this node's OS, and a Strict
// supplementalGroupsPolicy on a node that does not report supporting it.
func admitOnNode(pod *corev1.Pod, node *corev1.Node) (reason, message string, ok bool) {
	nodeOS := node.Labels[corev1.LabelOSStable]
	if nodeOS != runtime.GOOS {
		nodeOS = runtime.GOOS
	}
	if want, set := pod.Labels[corev1.LabelOSStable]; set && want != nodeOS {
		return "PodOSSelectorNodeLabelDoesNotMatch", "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label", false
	}
	if pod.Spec.OS != nil && string(pod.Spec.OS.Name) != runtime.GOOS {
		return "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS", false
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.SupplementalGroupsPolicy != nil &&
		*sc.SupplementalGroupsPolicy == corev1.SupplementalGroupsPolicyStrict {
		supported := node.Status.Features != nil && node.Status.Features.SupplementalGroupsPolicy != nil && *node.Status.Features.SupplementalGroupsPolicy
		if !supported {
			return "SupplementalGroupsPolicyNotSupported", fmt.Sprintf("SupplementalGroupsPolicy=%s is not supported in this node", corev1.SupplementalGroupsPolicyStrict), false
		}
	}
	return "", "", true
}

// predicateFailed is a rejection by one of the scheduler's predicates, worded as
// the kubelet's PredicateFailureError: the plugin's name is the reason.
func predicateFailed(plugin, desc string) (string, string, bool) {
	return plugin, fmt.Sprintf("Predicate %s failed: %s", plugin, desc), false
}

// hostPorts is the pod's host ports as the scheduler counts them: app containers'
// and restartable init containers' ports with a hostPort.
func hostPorts(pod *corev1.Pod) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	add := func(c *corev1.Container) {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				out = append(out, p)
			}
		}
	}
	for i := range pod.Spec.InitContainers {
		if podsync.IsRestartableInitContainer(&pod.Spec.InitContainers[i]) {
			add(&pod.Spec.InitContainers[i])
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}

// hostPortConflict reports whether one of pod's host ports is taken by another
// pod, with the scheduler's HostPortInfo rules: an empty host IP is 0.0.0.0 and an
// empty protocol TCP; 0.0.0.0 conflicts with the same protocol and port on any IP,
// and a specific IP with itself and 0.0.0.0. (k8s.io/kube-scheduler/framework has
// HostPortInfo, but importing it brings the dynamic-resource-allocation module for
// these few lines.)
func hostPortConflict(pod *corev1.Pod, others []*corev1.Pod) bool {
	type protoPort struct {
		proto string
		port  int32
	}
	const wildcard = "0.0.0.0"
	norm := func(p corev1.ContainerPort) (string, protoPort) {
		ip, proto := p.HostIP, string(p.Protocol)
		if ip == "" {
			ip = wildcard
		}
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		return ip, protoPort{proto, p.HostPort}
	}
	used := map[string]map[protoPort]bool{}
	for _, o := range others {
		for _, p := range hostPorts(o) {
			ip, pp := norm(p)
			if used[ip] == nil {
				used[ip] = map[protoPort]bool{}
			}
			used[ip][pp] = true
		}
	}
	for _, p := range hostPorts(pod) {
		ip, pp := norm(p)
		if ip == wildcard {
			for _, m := range used {
				if m[pp] {
					return true
				}
			}
			continue
		}
		if used[wildcard][pp] || used[ip][pp] {
			return true
		}
	}
	return false
}

func quantityValue(q resource.Quantity, r corev1.ResourceName) int64 {
	if r == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// isStatic reports a pod from a manifest (any config source but the API server), as
// the kubelet's IsStaticPod.
func isStatic(pod *corev1.Pod) bool {
	src, ok := pod.Annotations[staticpod.AnnotationConfigSource]
	return ok && src != "api"
}
