package main

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// serverPodList is serverPods for the pod manager: the pods it runs (not those that
// left the node and are being torn down), in namespace/name order; a static pod
// carries the status the kubelet computed, as the kubelet's GetPods.
func (m *podManager) serverPodList() []*corev1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(m.pods))
	for _, e := range m.pods {
		if e.gone {
			continue
		}
		p := e.pod
		if e.static && e.status != nil {
			p = p.DeepCopy()
			p.Status = *e.status.DeepCopy()
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// serverPod is serverPods for the pod manager.
func (m *podManager) serverPod(namespace, name string) (*corev1.Pod, *corev1.PodStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var found *podEntry
	for _, e := range m.pods {
		if e.gone || e.pod.Namespace != namespace || e.pod.Name != name {
			continue
		}
		// Two entries share a name only while a deleted pod's successor starts; the
		// newest wins, as in the kubelet's pod manager.
		if found == nil || e.firstSeen.After(found.firstSeen) {
			found = e
		}
	}
	if found == nil {
		return nil, nil, false
	}
	var st *corev1.PodStatus
	if found.status != nil {
		st = found.status.DeepCopy()
	}
	return found.pod, st, true
}
