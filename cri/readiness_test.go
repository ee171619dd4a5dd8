package cri_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
)

func TestReadinessFromStatus(t *testing.T) {
	runtimeOK := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	networkOK := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: true}
	noCNI := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Reason: "NetworkPluginNotReady",
		Message: "Network plugin returns error: cni plugin not initialized"}
	runtimeDown := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Reason: "RuntimeNotReady", Message: "shim broken"}

	tests := []struct {
		name       string
		conditions []*runtimeapi.RuntimeCondition
		want       cri.Readiness
	}{
		{
			name:       "ready",
			conditions: []*runtimeapi.RuntimeCondition{runtimeOK, networkOK},
			want:       cri.Readiness{Ready: true, RuntimeReady: true, NetworkReady: true, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
		},
		{
			name:       "no CNI: the seed's message",
			conditions: []*runtimeapi.RuntimeCondition{runtimeOK, noCNI},
			want: cri.Readiness{RuntimeReady: true, Reason: "KubeletNotReady",
				Message: "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"},
		},
		{
			name:       "both down: runtime first, aggregated in brackets",
			conditions: []*runtimeapi.RuntimeCondition{noCNI, runtimeDown},
			want: cri.Readiness{Reason: "KubeletNotReady",
				Message: "[container runtime not ready: RuntimeReady=false reason:RuntimeNotReady message:shim broken, " +
					"container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized]"},
		},
		{
			name:       "missing network condition prints <nil>",
			conditions: []*runtimeapi.RuntimeCondition{runtimeOK},
			want:       cri.Readiness{RuntimeReady: true, Reason: "KubeletNotReady", Message: "container runtime network not ready: <nil>"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := cri.ReadinessFromStatus(&runtimeapi.RuntimeStatus{Conditions: tt.conditions})
			assert.Equal(t, tt.want, got)
			if tt.want.Ready {
				assert.NoError(t, got.Err())
			} else {
				assert.EqualError(t, got.Err(), tt.want.Message)
			}
		})
	}
	assert.Equal(t, "[container runtime not ready: <nil>, container runtime network not ready: <nil>]",
		cri.ReadinessFromStatus(nil).Message)
}

func TestClientReadiness(t *testing.T) {
	f := startFake(t, cri.Config{})
	ctx := context.Background()
	r, err := f.client.Readiness(ctx)
	require.NoError(t, err)
	assert.True(t, r.Ready)

	f.rt.NetworkNotReady()
	r, err = f.client.Readiness(ctx)
	require.NoError(t, err)
	assert.False(t, r.Ready)
	assert.Equal(t, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized", r.Message)

	f.rt.FailNext("Status", status.Error(codes.Unavailable, "connection refused"))
	r, err = f.client.Readiness(ctx)
	require.ErrorIs(t, err, cri.ErrUnavailable)
	assert.Equal(t, cri.Readiness{Reason: "KubeletNotReady", Message: "container runtime is down"}, r)
}
