package staticpod_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/staticpod"
	"github.com/nodekit-dev/nodekit/staticpod/staticpodtest"
)

// TestMirrorPodsRealControlPlane runs the watcher and the reconciler against a real
// kube-apiserver (Node,RBAC authorization, NodeRestriction admission) with a
// client-certificate identity system:node:<name>, exactly what a kubelet has.
func TestMirrorPodsRealControlPlane(t *testing.T) {
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	const nodeName = "sp-cp-1"
	node := cp.CreateNode(t, nodeName)
	admin := cp.AdminClient()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	dir := t.TempDir()
	for _, f := range []string{"etcd.yaml", "kube-apiserver.yaml", "kube-controller-manager.yaml", "kube-scheduler.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", "kubeadm", f))
		require.NoError(t, err)
		staticpodtest.WriteManifest(t, dir, f, data)
	}
	w, err := staticpod.New(staticpod.Config{Dir: dir, NodeName: nodeName})
	require.NoError(t, err)
	r, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{
		Client:       cp.NodeClient(nodeName),
		NodeName:     nodeName,
		ResyncPeriod: time.Second,
	})
	require.NoError(t, err)
	watchDone := make(chan error, 1)
	go func() { watchDone <- w.Run(ctx) }()
	reconcileDone := make(chan error, 1)
	go func() { reconcileDone <- r.Run(ctx, w.Events()) }()
	defer func() {
		cancel()
		require.NoError(t, <-watchDone)
		require.NoError(t, <-reconcileDone)
	}()

	// mirrors returns the mirror pods on the API server by name.
	mirrors := func() map[string]corev1.Pod {
		list, err := admin.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		out := map[string]corev1.Pod{}
		for _, p := range list.Items {
			if _, ok := p.Annotations[staticpod.AnnotationConfigMirror]; ok {
				out[p.Name] = p
			}
		}
		return out
	}
	// inSync reports whether the API server's mirror pods are exactly the watcher's set.
	inSync := func() bool {
		want := map[string]string{}
		for _, p := range w.Pods() {
			want[p.Name] = p.Annotations[staticpod.AnnotationConfigHash]
		}
		got := mirrors()
		if len(got) != len(want) {
			return false
		}
		for name, hash := range want {
			if m, ok := got[name]; !ok || m.Annotations[staticpod.AnnotationConfigMirror] != hash || m.DeletionTimestamp != nil {
				return false
			}
		}
		return true
	}

	start := time.Now()
	require.Eventually(t, func() bool { return len(w.Pods()) == 4 && inSync() }, 30*time.Second, 100*time.Millisecond)
	t.Logf("4 mirror pods posted %v after start", time.Since(start).Round(time.Millisecond))
	for name, m := range mirrors() {
		require.Len(t, m.OwnerReferences, 1, name)
		assert.Equal(t, node.UID, m.OwnerReferences[0].UID, "%s is owned by the Node", name)
		assert.Equal(t, nodeName, m.Spec.NodeName)
		assert.Equal(t, "file", m.Annotations[staticpod.AnnotationConfigSource])
	}
	etcdName := "etcd-" + nodeName

	t.Run("edit replaces the mirror pod", func(t *testing.T) {
		before := mirrors()[etcdName]
		data, err := os.ReadFile(filepath.Join(dir, "etcd.yaml"))
		require.NoError(t, err)
		staticpodtest.WriteManifest(t, dir, "etcd.yaml", []byte(strings.Replace(string(data), "etcd:3.6.4-0", "etcd:3.6.5-0", 1)))
		require.Eventually(t, func() bool {
			m, ok := mirrors()[etcdName]
			return ok && m.UID != before.UID && inSync()
		}, 30*time.Second, 100*time.Millisecond)
		assert.Equal(t, "registry.k8s.io/etcd:3.6.5-0", mirrors()[etcdName].Spec.Containers[0].Image)
	})

	t.Run("deleting a manifest deletes its mirror pod", func(t *testing.T) {
		require.NoError(t, os.Remove(filepath.Join(dir, "kube-scheduler.json")))
		require.Eventually(t, func() bool {
			_, ok := mirrors()["kube-scheduler-"+nodeName]
			return !ok && inSync()
		}, 30*time.Second, 100*time.Millisecond)
	})

	t.Run("a broken manifest keeps its mirror pod", func(t *testing.T) {
		name := "kube-apiserver-" + nodeName
		before := mirrors()[name]
		require.NoError(t, os.WriteFile(filepath.Join(dir, "kube-apiserver.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata: [\n"), 0o644))
		time.Sleep(3 * time.Second) // three resyncs
		after, ok := mirrors()[name]
		require.True(t, ok)
		assert.Equal(t, before.UID, after.UID)
	})

	t.Run("a second reconciler agrees: nothing to do", func(t *testing.T) {
		before := mirrors()
		r2, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{Client: cp.NodeClient(nodeName), NodeName: nodeName})
		require.NoError(t, err)
		require.NoError(t, r2.Sync(ctx, w.Pods()))
		for name, m := range mirrors() {
			assert.Equal(t, before[name].UID, m.UID, name)
		}
	})

	t.Run("a cache that lags costs requests, never the outcome", func(t *testing.T) {
		before := mirrors()
		require.NotEmpty(t, before)
		apiNode, err := admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		require.NoError(t, err)
		// Stale copies: every mirror pod with another UID and an old hash (replaced
		// since), and one whose static pod and mirror pod are both gone.
		var stale []*corev1.Pod
		for _, m := range before {
			c := m.DeepCopy()
			c.UID = types.UID("11111111-1111-1111-1111-" + strings.Repeat("1", 12))
			c.Annotations[staticpod.AnnotationConfigMirror] = "an-old-hash"
			stale = append(stale, c)
		}
		first := before[w.Pods()[0].Name]
		gone := first.DeepCopy()
		gone.Name, gone.UID = "gone-"+nodeName, types.UID("22222222-2222-2222-2222-222222222222")
		stale = append(stale, gone)

		for _, tc := range []struct {
			name string
			pods []*corev1.Pod
		}{
			{"has not seen the mirror pods yet", nil},
			{"still shows replaced and deleted mirror pods", stale},
		} {
			cache := &fixedCache{node: apiNode, pods: tc.pods}
			r3, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{Client: cp.NodeClient(nodeName), NodeName: nodeName, Cache: cache})
			require.NoError(t, err)
			require.NoError(t, r3.Sync(ctx, w.Pods()), tc.name)
			assert.Equal(t, 1, cache.nodeReads, tc.name)
			assert.Equal(t, 1, cache.podReads, tc.name)
			after := mirrors()
			assert.Len(t, after, len(before), tc.name)
			for name, m := range after {
				assert.Equal(t, before[name].UID, m.UID, "%s: %s kept", tc.name, name)
			}
		}

		// A Node the cache has not seen is an error naming it; nothing is touched.
		r4, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{Client: cp.NodeClient(nodeName), NodeName: nodeName, Cache: &fixedCache{}})
		require.NoError(t, err)
		err = r4.Sync(ctx, w.Pods())
		require.ErrorIs(t, err, staticpod.ErrMirrorPod)
		assert.True(t, apierrors.IsNotFound(err), "got %v", err)
		assert.Contains(t, err.Error(), nodeName)
	})

	t.Run("the API server's rules the reconciler relies on", func(t *testing.T) {
		nodeClient := cp.NodeClient(nodeName)
		static := w.Pods()[0]

		// Creating the same mirror pod again: AlreadyExists (which Sync turns into
		// success after checking the hash).
		_, err := nodeClient.CoreV1().Pods(static.Namespace).Create(ctx, staticpod.MirrorPod(static, node), metav1.CreateOptions{})
		assert.True(t, apierrors.IsAlreadyExists(err), "got %v", err)

		// NodeRestriction refuses a mirror pod without the owner reference to the Node.
		orphan := staticpod.MirrorPod(static, node)
		orphan.Name = "no-owner-" + nodeName
		orphan.OwnerReferences = nil
		_, err = nodeClient.CoreV1().Pods(orphan.Namespace).Create(ctx, orphan, metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "got %v", err)

		// Another node's identity cannot post this node's mirror pod.
		other := cp.CreateNode(t, "sp-other-1")
		foreign := staticpod.MirrorPod(static, other)
		foreign.Name = "foreign-" + nodeName
		_, err = cp.NodeClient("sp-other-1").CoreV1().Pods(foreign.Namespace).Create(ctx, foreign, metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "got %v", err)

		// A delete whose UID precondition no longer holds is a Conflict and removes nothing.
		cur := mirrors()[static.Name]
		wrong := types.UID("00000000-0000-0000-0000-000000000000")
		zero := int64(0)
		err = nodeClient.CoreV1().Pods(cur.Namespace).Delete(ctx, cur.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &wrong},
		})
		assert.True(t, apierrors.IsConflict(err), "got %v", err)
		_, ok := mirrors()[static.Name]
		assert.True(t, ok)
	})

	t.Run("mirror pod deleted behind our back is recreated", func(t *testing.T) {
		name := "kube-controller-manager-" + nodeName
		before := mirrors()[name]
		zero := int64(0)
		require.NoError(t, admin.CoreV1().Pods("kube-system").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
		require.Eventually(t, func() bool {
			m, ok := mirrors()[name]
			return ok && m.UID != before.UID
		}, 30*time.Second, 100*time.Millisecond)
	})
}

// fixedCache is a staticpod.Cache frozen at what it was given, counting its reads.
type fixedCache struct {
	node                *corev1.Node
	pods                []*corev1.Pod
	nodeReads, podReads int
}

func (c *fixedCache) Node(_ context.Context, name string) (*corev1.Node, error) {
	c.nodeReads++
	if c.node == nil {
		return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
	}
	return c.node, nil
}

func (c *fixedCache) PodsOnNode(context.Context, string) ([]*corev1.Pod, error) {
	c.podReads++
	return c.pods, nil
}
