package main

import (
	"context"
	"encoding/json"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// statusManager writes pod status through the status subresource, only when it
// differs from what the API server has, as the kubelet's status manager does; a
// static pod's status goes to its mirror pod.
type statusManager struct {
	client kubernetes.Interface
	clock  clock.Clock

	mu     sync.Mutex
	store  cache.Store
	last   map[types.UID]*corev1.PodStatus
	writes int
}

func newStatusManager(c kubernetes.Interface, clk clock.Clock) *statusManager {
	return &statusManager{client: c, clock: clk, last: map[types.UID]*corev1.PodStatus{}}
}

func (s *statusManager) setLister(st cache.Store) {
	s.mu.Lock()
	s.store = st
	s.mu.Unlock()
}

func (s *statusManager) forget(uid types.UID) {
	s.mu.Lock()
	delete(s.last, uid)
	s.mu.Unlock()
}

// current returns the API server's copy of the pod (the mirror pod for a static
// pod) from the informer's store.
func (s *statusManager) current(pod *corev1.Pod) *corev1.Pod {
	s.mu.Lock()
	st := s.store
	s.mu.Unlock()
	if st == nil {
		return nil
	}
	obj, ok, err := st.GetByKey(pod.Namespace + "/" + pod.Name)
	if err != nil || !ok {
		return nil
	}
	p, _ := obj.(*corev1.Pod)
	return p
}

func (s *statusManager) write(ctx context.Context, pod *corev1.Pod, static bool, st *corev1.PodStatus) {
	if s.client == nil {
		return
	}
	target := pod
	if static {
		mirror := s.current(pod)
		if mirror == nil || !isMirror(mirror) {
			return // no mirror pod yet; the next sync writes it
		}
		target = mirror
	} else if cur := s.current(pod); cur != nil && cur.UID == pod.UID {
		target = cur
	}
	if apiequality.Semantic.DeepEqual(&target.Status, st) {
		return
	}
	oldData, err := json.Marshal(corev1.Pod{Status: target.Status})
	if err != nil {
		return
	}
	// Compared as the API server stores it (times in whole seconds): a status that
	// differs only below that is unchanged.
	if newJSON, err := json.Marshal(corev1.Pod{Status: *st}); err == nil && string(newJSON) == string(oldData) {
		return
	}
	// The UID in the new side makes the patch carry it as a precondition: a pod
	// recreated under the same name is not written with this one's status.
	newData, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: target.UID}, Status: *st})
	if err != nil {
		return
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldData, newData, corev1.Pod{})
	if err != nil {
		klog.ErrorS(err, "Failed to make pod status patch", "pod", klog.KObj(pod))
		return
	}
	_, err = s.client.CoreV1().Pods(target.Namespace).Patch(ctx, target.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		if !apierrors.IsNotFound(err) {
			klog.ErrorS(err, "Failed to update status for pod", "pod", klog.KObj(pod))
		}
		return
	}
	klog.V(3).InfoS("Patch status for pod", "pod", klog.KObj(pod), "podUID", pod.UID, "patch", string(patch))
	s.mu.Lock()
	s.last[pod.UID] = st.DeepCopy()
	s.writes++
	s.mu.Unlock()
}
