package podenvtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/podenv"
	"github.com/nodekit-dev/nodekit/podenv/podenvtest"
)

var _ podenv.Source = (*podenvtest.Source)(nil)

func TestSource(t *testing.T) {
	s := podenvtest.New(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "z"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "b"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "c"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "s"}, Data: map[string][]byte{"k": []byte("v")}},
	)
	ctx := context.Background()
	svcs, err := s.Services(ctx, "a")
	require.NoError(t, err)
	require.Len(t, svcs, 2)
	assert.Equal(t, "b", svcs[0].Name, "sorted by name, one namespace")
	sec, err := s.Secret(ctx, "a", "s")
	require.NoError(t, err)
	assert.Equal(t, "v", string(sec.Data["k"]))
	_, err = s.ConfigMap(ctx, "a", "missing")
	assert.True(t, apierrors.IsNotFound(err))
	s.Err = errors.New("down")
	_, err = s.Services(ctx, "a")
	assert.EqualError(t, err, "down")
	assert.Equal(t, []string{"services a", "secret a/s", "configmap a/missing", "services a"}, s.Calls())
}
