package volume_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/volume"
)

// TestAgainstAPIServer sets up the projected service account volume that the API
// server's ServiceAccount admission adds to every pod (kube-api-access-*), with
// the credentials of the node the pod is bound to, exactly as a kubelet would:
// the Node authorizer and NodeRestriction judge every read and token request.
// The token it writes is then checked with a TokenReview.
func TestAgainstAPIServer(t *testing.T) {
	testenv.RequireLong(t)
	cp := controlplane.Start(t, controlplane.Options{})
	admin := cp.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const ns, nodeName = "shop", "node-volume"
	cp.CreateNode(t, nodeName)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "cart"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// kube-controller-manager's root-ca-cert-publisher is not running here; publish
	// the configMap it would.
	_, err = admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
		Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data: map[string]string{"level": "debug"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cart-0"},
		Spec: corev1.PodSpec{
			NodeName:           nodeName,
			ServiceAccountName: "cart",
			Containers:         []corev1.Container{{Name: "app", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	var apiVolume string
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil {
			apiVolume = v.Name
		}
	}
	require.NotEmpty(t, apiVolume, "ServiceAccount admission added the projected token volume")

	clk := clocktesting.NewFakeClock(time.Now())
	root := t.TempDir()
	m, err := volume.New(volume.Config{
		RootDir: root,
		Sources: volume.ClientsetSources(cp.NodeClient(nodeName)),
		Clock:   clk,
		Mounter: volume.NoMount{},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Teardown(context.Background(), pod.UID) })

	// The Node authorizer learns of the pod's references asynchronously (its
	// graph follows a watch), so the first reads may be refused for a moment.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := m.Setup(ctx, pod)
		if err != nil {
			t.Logf("Setup: %v", err)
		}
		return err == nil, nil
	}))

	dir := filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~projected", apiVolume)
	token1 := readFile(t, filepath.Join(dir, "token"))
	assert.NotEmpty(t, readFile(t, filepath.Join(dir, "ca.crt")))
	assert.Equal(t, ns, readFile(t, filepath.Join(dir, "namespace")))
	assert.Equal(t, "debug", readFile(t, filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~configmap", "settings", "level")))

	review := func(token string) *authenticationv1.TokenReviewStatus {
		tr, err := admin.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return &tr.Status
	}
	st := review(token1)
	require.True(t, st.Authenticated, "token authenticates: %s", st.Error)
	assert.Equal(t, "system:serviceaccount:shop:cart", st.User.Username)
	assert.Equal(t, authenticationv1.ExtraValue{"cart-0"}, st.User.Extra["authentication.kubernetes.io/pod-name"], "bound to the pod")
	assert.Equal(t, authenticationv1.ExtraValue{string(pod.UID)}, st.User.Extra["authentication.kubernetes.io/pod-uid"])
	assert.Equal(t, authenticationv1.ExtraValue{nodeName}, st.User.Extra["authentication.kubernetes.io/node-name"])

	// A second Setup before 80% of the TTL keeps the token.
	require.NoError(t, m.Setup(ctx, pod))
	assert.Equal(t, token1, readFile(t, filepath.Join(dir, "token")))

	// Past 80% of the TTL (admission asks for 3607s): a fresh token replaces it.
	clk.Step(3607 * 81 / 100 * time.Second)
	require.NoError(t, m.Setup(ctx, pod))
	token2 := readFile(t, filepath.Join(dir, "token"))
	assert.NotEqual(t, token1, token2)
	assert.True(t, review(token2).Authenticated)

	// A configMap update reaches the file on the next Setup.
	_, err = admin.CoreV1().ConfigMaps(ns).Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data: map[string]string{"level": "info"}}, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Setup(ctx, pod))
	assert.Equal(t, "info", readFile(t, filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~configmap", "settings", "level")))

	// Once the pod is deleted the token no longer authenticates: it was bound to it.
	require.NoError(t, admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, *metav1.NewDeleteOptions(0)))
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}))
	// The API server caches successful authentications for 10s.
	assert.Eventually(t, func() bool { return !review(token2).Authenticated }, 30*time.Second, time.Second,
		"a token bound to a deleted pod is refused")

	// The node cannot get tokens for pods that are not bound to it.
	other := pod.DeepCopy()
	other.Name, other.UID = "not-mine", "0000-not-mine"
	err = m.Setup(ctx, other)
	require.Error(t, err)
	t.Logf("token for a foreign pod: %v", err)
	assert.True(t, apierrors.IsForbidden(errorsCause(err)) || apierrors.IsNotFound(errorsCause(err)), "refused by the API server: %v", err)
	require.NoError(t, m.Teardown(ctx, pod.UID))
	require.NoError(t, m.Teardown(ctx, other.UID))
	_, err = os.Stat(filepath.Join(root, "pods", string(pod.UID), "volumes"))
	assert.True(t, os.IsNotExist(err))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

// errorsCause digs the API error out of the joined setup errors.
func errorsCause(err error) error {
	for _, e := range flatten(err) {
		if _, ok := e.(apierrors.APIStatus); ok {
			return e
		}
	}
	return err
}

func flatten(err error) []error {
	out := []error{err}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			out = append(out, flatten(e)...)
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			out = append(out, flatten(e)...)
		}
	}
	return out
}
