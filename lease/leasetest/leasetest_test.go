package leasetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/lease/leasetest"
)

var t0 = time.Date(2026, 7, 16, 9, 14, 0, 0, time.UTC)

func TestFakeBehavesLikeTheAPIServer(t *testing.T) {
	ctx := context.Background()
	f := leasetest.New(leasetest.Node("n1", "u1"), leasetest.Lease("ns", "a", "h", t0, 40*time.Second))
	leases := f.Clientset.CoordinationV1().Leases("ns")

	a, err := leases.Get(ctx, "a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "1", a.ResourceVersion)

	_, err = leases.Create(ctx, a, metav1.CreateOptions{})
	assert.True(t, apierrors.IsAlreadyExists(err), "got %v", err)

	updated, err := leases.Update(ctx, a, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "2", updated.ResourceVersion)

	_, err = leases.Update(ctx, a, metav1.UpdateOptions{}) // a still carries rv 1
	assert.True(t, apierrors.IsConflict(err), "stale resourceVersion must conflict, got %v", err)

	require.NoError(t, f.SetRenewTime("ns", "a", t0.Add(time.Second)))
	_, err = leases.Update(ctx, updated, metav1.UpdateOptions{})
	assert.True(t, apierrors.IsConflict(err), "another writer must cause a conflict, got %v", err)

	f.FailNext("get", "nodes", 1, leasetest.ServerTimeout())
	_, err = f.Clientset.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	assert.True(t, apierrors.IsServerTimeout(err), "got %v", err)
	_, err = f.Clientset.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	assert.NoError(t, err, "FailNext n=1 fails one request only")

	assert.Equal(t, []string{
		"get lease ns/a", "create lease ns/a", "update lease ns/a", "update lease ns/a",
		"update lease ns/a", "get node n1", "get node n1",
	}, f.Requests())
	assert.Equal(t, "ns/a holder=h duration=40s renew=2026-07-16T09:14:01Z owners=- rv=3\n", f.Dump())
}

func TestFakeErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		is   func(error) bool
	}{
		{"server timeout", leasetest.ServerTimeout(), apierrors.IsServerTimeout},
		{"conflict", leasetest.Conflict("a"), apierrors.IsConflict},
		{"not found", leasetest.NotFound("leases", "a"), apierrors.IsNotFound},
		{"forbidden", leasetest.Forbidden("a"), apierrors.IsForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := leasetest.New()
			f.FailNext("create", "leases", 1, tt.err)
			_, err := f.Clientset.CoordinationV1().Leases("ns").Create(context.Background(),
				leasetest.Lease("ns", "a", "h", t0, time.Minute), metav1.CreateOptions{})
			assert.True(t, tt.is(err), "got %v", err)
		})
	}
}

func TestFakeDuplicateSeed(t *testing.T) {
	f := leasetest.New(leasetest.Node("n1", "u1"), leasetest.Node("n1", "u2"))
	_, err := f.Clientset.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "leasetest.New")
}
