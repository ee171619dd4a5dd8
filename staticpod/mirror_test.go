package staticpod_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/staticpod"
)

func testNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("node-uid-" + name)}}
}

func staticPod(t *testing.T, name, image, node string) *corev1.Pod {
	t.Helper()
	return mustParse(t, "/etc/kubernetes/manifests/"+name+".yaml", node, string(podYAML(name, image)))
}

func TestMirrorPod(t *testing.T) {
	static := staticPod(t, "web", "nginx:1", "node-a")
	m := staticpod.MirrorPod(static, testNode("node-a"))

	assert.Equal(t, static.Annotations[staticpod.AnnotationConfigHash], m.Annotations[staticpod.AnnotationConfigMirror])
	require.Len(t, m.OwnerReferences, 1)
	ref := m.OwnerReferences[0]
	assert.Equal(t, "v1", ref.APIVersion)
	assert.Equal(t, "Node", ref.Kind)
	assert.Equal(t, "node-a", ref.Name)
	assert.Equal(t, types.UID("node-uid-node-a"), ref.UID)
	require.NotNil(t, ref.Controller)
	assert.True(t, *ref.Controller)
	_, hasMirror := static.Annotations[staticpod.AnnotationConfigMirror]
	assert.False(t, hasMirror, "the static pod itself is not modified")
	assert.True(t, staticpod.IsMirrorOf(m, static))

	other := staticPod(t, "web", "nginx:2", "node-a")
	assert.False(t, staticpod.IsMirrorOf(m, other), "a new manifest version has another hash")
}

func mirrorOn(t *testing.T, static *corev1.Pod, node *corev1.Node, uid string) *corev1.Pod {
	t.Helper()
	m := staticpod.MirrorPod(static, node)
	m.UID = types.UID(uid)
	return m
}

func newReconciler(t *testing.T, objs ...runtime.Object) (*staticpod.Reconciler, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	r, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{Client: client, NodeName: "node-a"})
	require.NoError(t, err)
	return r, client
}

// writes returns the mutating calls a test made, as "verb name" strings, with the
// UID precondition of deletes.
func writes(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		switch a := a.(type) {
		case k8stesting.CreateAction:
			out = append(out, "create "+a.GetObject().(metav1.Object).GetName())
		case k8stesting.DeleteAction:
			s := "delete " + a.GetName()
			if p := a.GetDeleteOptions().Preconditions; p != nil && p.UID != nil {
				s += " uid=" + string(*p.UID)
			}
			if g := a.GetDeleteOptions().GracePeriodSeconds; g != nil && *g == 0 {
				s += " now"
			}
			out = append(out, s)
		}
	}
	return out
}

func TestReconcilerSync(t *testing.T) {
	node := testNode("node-a")
	web := staticPod(t, "web", "nginx:1", "node-a")
	webV2 := staticPod(t, "web", "nginx:2", "node-a")
	db := staticPod(t, "db", "postgres:16", "node-a")

	tests := []struct {
		name     string
		existing []runtime.Object
		static   []*corev1.Pod
		want     []string
		wantErr  string
	}{
		{
			name:   "creates missing mirror pods",
			static: []*corev1.Pod{web, db},
			want:   []string{"create web-node-a", "create db-node-a"},
		},
		{
			name:     "leaves a matching mirror pod alone",
			existing: []runtime.Object{mirrorOn(t, web, node, "m1")},
			static:   []*corev1.Pod{web},
			want:     nil,
		},
		{
			name:     "replaces a mirror pod whose hash differs, with a UID precondition",
			existing: []runtime.Object{mirrorOn(t, web, node, "m1")},
			static:   []*corev1.Pod{webV2},
			want:     []string{"delete web-node-a uid=m1 now", "create web-node-a"},
		},
		{
			name:     "deletes the mirror pod of a removed static pod",
			existing: []runtime.Object{mirrorOn(t, web, node, "m1"), mirrorOn(t, db, node, "m2")},
			static:   []*corev1.Pod{db},
			want:     []string{"delete web-node-a uid=m1 now"},
		},
		{
			name: "never touches a pod that is not a mirror pod",
			existing: []runtime.Object{&corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "web-node-a", Namespace: "default", UID: "regular"},
				Spec:       corev1.PodSpec{NodeName: "node-a"},
			}},
			static:  []*corev1.Pod{web},
			want:    nil,
			wantErr: "default/web-node-a exists and is not a mirror pod",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, client := newReconciler(t, append([]runtime.Object{node}, tt.existing...)...)
			err := r.Sync(context.Background(), tt.static)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, staticpod.ErrMirrorPod)
				assert.Contains(t, err.Error(), tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.want, writes(client))

			pods, err := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
			require.NoError(t, err)
			for _, p := range pods.Items {
				if _, ok := p.Annotations[staticpod.AnnotationConfigMirror]; !ok {
					continue
				}
				assert.Len(t, p.OwnerReferences, 1, "every mirror pod is owned by the node")
			}
		})
	}
}

func TestReconcilerAlreadyExists(t *testing.T) {
	node := testNode("node-a")
	web := staticPod(t, "web", "nginx:1", "node-a")
	webV2 := staticPod(t, "web", "nginx:2", "node-a")

	// The list is stale (it misses a mirror pod another writer just created), so
	// Create meets AlreadyExists.
	staleList := func(client *fake.Clientset) {
		client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, &corev1.PodList{}, nil
		})
	}

	t.Run("same hash is success", func(t *testing.T) {
		r, client := newReconciler(t, node, mirrorOn(t, web, node, "m1"))
		staleList(client)
		require.NoError(t, r.Sync(context.Background(), []*corev1.Pod{web}))
		assert.Equal(t, []string{"create web-node-a"}, writes(client))
	})
	t.Run("another hash is an error naming the pod", func(t *testing.T) {
		r, client := newReconciler(t, node, mirrorOn(t, web, node, "m1"))
		staleList(client)
		err := r.Sync(context.Background(), []*corev1.Pod{webV2})
		require.ErrorIs(t, err, staticpod.ErrMirrorPod)
		assert.True(t, apierrors.IsAlreadyExists(err), "the API error stays wrapped")
		assert.Contains(t, err.Error(), "default/web-node-a")
	})
}

func TestReconcilerDeleteRaces(t *testing.T) {
	node := testNode("node-a")
	web := staticPod(t, "web", "nginx:1", "node-a")
	for name, apiErr := range map[string]error{
		"already gone":            apierrors.NewNotFound(corev1.Resource("pods"), "web-node-a"),
		"uid precondition failed": apierrors.NewConflict(corev1.Resource("pods"), "web-node-a", nil),
	} {
		t.Run(name, func(t *testing.T) {
			r, client := newReconciler(t, node, mirrorOn(t, web, node, "m1"))
			client.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apiErr
			})
			assert.NoError(t, r.Sync(context.Background(), nil), "a vanished or replaced pod is not an error")
		})
	}
}

func TestReconcilerNodeProblems(t *testing.T) {
	web := staticPod(t, "web", "nginx:1", "node-a")
	t.Run("node not registered", func(t *testing.T) {
		r, client := newReconciler(t)
		err := r.Sync(context.Background(), []*corev1.Pod{web})
		require.ErrorIs(t, err, staticpod.ErrMirrorPod)
		assert.True(t, apierrors.IsNotFound(err))
		assert.Empty(t, writes(client))
	})
	t.Run("node being deleted", func(t *testing.T) {
		node := testNode("node-a")
		now := metav1.Now()
		node.DeletionTimestamp = &now
		node.Finalizers = []string{"keep"}
		r, client := newReconciler(t, node)
		require.NoError(t, r.Sync(context.Background(), []*corev1.Pod{web}))
		assert.Empty(t, writes(client), "no mirror pods for a node on its way out")
	})
}

func TestNewReconcilerValidation(t *testing.T) {
	_, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{NodeName: "n"})
	assert.ErrorIs(t, err, staticpod.ErrInvalidConfig)
	_, err = staticpod.NewReconciler(staticpod.ReconcilerConfig{Client: fake.NewClientset()})
	assert.ErrorIs(t, err, staticpod.ErrInvalidConfig)
}

func TestReconcilerRun(t *testing.T) {
	node := testNode("node-a")
	web := staticPod(t, "web", "nginx:1", "node-a")
	client := fake.NewClientset(node)
	clk := clocktesting.NewFakeClock(seenTime)
	r, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{Client: client, NodeName: "node-a", Clock: clk, ResyncPeriod: 10 * time.Second})
	require.NoError(t, err)
	events := make(chan staticpod.Event)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background(), events) }()

	events <- staticpod.Event{Type: staticpod.EventSync, Pods: []*corev1.Pod{web}}
	require.Eventually(t, func() bool {
		_, err := client.CoreV1().Pods("default").Get(context.Background(), "web-node-a", metav1.GetOptions{})
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)

	// Someone deletes the mirror pod; the next resync recreates it.
	require.NoError(t, client.CoreV1().Pods("default").Delete(context.Background(), "web-node-a", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		clk.Step(10 * time.Second)
		_, err := client.CoreV1().Pods("default").Get(context.Background(), "web-node-a", metav1.GetOptions{})
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)

	close(events)
	require.NoError(t, <-done, "Run returns when the event channel closes")
}
