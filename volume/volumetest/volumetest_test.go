package volumetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

var (
	_ volume.Sources = (*volumetest.Sources)(nil)
	_ volume.Mounter = (*volumetest.RecordingMounter)(nil)
)

func TestSources(t *testing.T) {
	now := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	s := volumetest.New(clk,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "v"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sa"}},
		"ignored",
	)
	ctx := context.Background()
	cm, err := s.ConfigMap(ctx, "ns", "cm")
	require.NoError(t, err)
	assert.Equal(t, "v", cm.Data["k"])
	cm.Data["k"] = "changed by the caller"
	again, _ := s.ConfigMap(ctx, "ns", "cm")
	assert.Equal(t, "v", again.Data["k"], "callers get copies")

	_, err = s.ConfigMap(ctx, "other", "cm")
	assert.True(t, apierrors.IsNotFound(err))
	_, err = s.Secret(ctx, "ns", "nope")
	assert.True(t, apierrors.IsNotFound(err))

	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	tr, err := s.ServiceAccountToken(ctx, "ns", "sa", req)
	require.NoError(t, err)
	assert.Equal(t, "token-1", tr.Status.Token)
	assert.Equal(t, now.Add(600*time.Second), tr.Status.ExpirationTimestamp.Time)
	tr, err = s.ServiceAccountToken(ctx, "ns", "sa", &authenticationv1.TokenRequest{})
	require.NoError(t, err)
	assert.Equal(t, "token-2", tr.Status.Token)
	assert.Equal(t, int64(3600), *tr.Spec.ExpirationSeconds, "the API server's default")
	_, err = s.ServiceAccountToken(ctx, "ns", "ghost", req)
	assert.True(t, apierrors.IsNotFound(err))
	s.TokenErr = errors.New("down")
	_, err = s.ServiceAccountToken(ctx, "ns", "sa", req)
	assert.EqualError(t, err, "down")
	assert.Len(t, s.TokenRequests(), 4)

	s.Delete("configmap", "ns", "cm")
	_, err = s.ConfigMap(ctx, "ns", "cm")
	assert.True(t, apierrors.IsNotFound(err))

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Secret(cctx, "ns", "x")
	assert.ErrorIs(t, err, context.Canceled)
}

func TestRecordingMounter(t *testing.T) {
	r := &volumetest.RecordingMounter{}
	require.NoError(t, r.MountTmpfs("/a/b", 0))
	require.NoError(t, r.BindMount("/src", "/a/b/c"))
	require.NoError(t, r.MountTmpfs("/other", 0))
	mps, err := r.MountPoints("/a")
	require.NoError(t, err)
	assert.Equal(t, []string{"/a/b/c", "/a/b"}, mps, "deepest first, only below /a")
	r.UnmountErr = errors.New("busy")
	assert.Error(t, r.Unmount("/a/b/c"))
	r.UnmountErr = nil
	require.NoError(t, r.Unmount("/a/b/c"))
	mps, _ = r.MountPoints("/a")
	assert.Equal(t, []string{"/a/b"}, mps)
	assert.Equal(t, []string{"mount tmpfs /a/b", "mount bind /src /a/b/c", "mount tmpfs /other", "umount /a/b/c", "umount /a/b/c"}, r.Calls())
}
