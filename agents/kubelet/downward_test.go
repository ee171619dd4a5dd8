package main

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The downward API's limits.* default to the node's allocatable when the
// container sets no limit, as the kubelet's defaultPodLimitsForDownwardAPI.
func TestDownwardLimitsDefaultToNodeAllocatable(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{})
	alloc := ns.allocatable()
	cpu, mem := alloc[corev1.ResourceCPU], alloc[corev1.ResourceMemory]
	require.False(t, cpu.IsZero())
	require.False(t, mem.IsZero())

	env, _, err := newEnvAndVolumes(podManagerConfig{cfg: ns.cfg, rootDir: t.TempDir(), node: ns}, emptyEnvSource{}, nil, nil, nil)
	require.NoError(t, err)
	ref := func(name, res string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: res}}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dapi", Namespace: "team", UID: "uid-1"},
		Spec: corev1.PodSpec{EnableServiceLinks: new(bool), Containers: []corev1.Container{{
			Name: "c", Image: "busybox",
			Env: []corev1.EnvVar{ref("CPU_LIMIT", "limits.cpu"), ref("MEMORY_LIMIT", "limits.memory"), ref("CPU_REQUEST", "requests.cpu")},
		}, {
			Name: "limited", Image: "busybox",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}},
			Env:       []corev1.EnvVar{ref("CPU_LIMIT", "limits.cpu")},
		}}},
	}
	got := map[string]string{}
	kvs, err := env.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, []string{"10.0.0.5"})
	require.NoError(t, err)
	for _, kv := range kvs {
		got[kv.Key] = string(kv.Value)
	}
	assert.Equal(t, strconv.FormatInt((cpu.MilliValue()+999)/1000, 10), got["CPU_LIMIT"], "whole cores, rounded up")
	assert.Equal(t, strconv.FormatInt(mem.Value(), 10), got["MEMORY_LIMIT"], "bytes")
	assert.Equal(t, "0", got["CPU_REQUEST"], "requests are not defaulted")

	kvs, err = env.Env(context.Background(), pod, &pod.Spec.Containers[1], nil, []string{"10.0.0.5"})
	require.NoError(t, err)
	for _, kv := range kvs {
		got[kv.Key] = string(kv.Value)
	}
	assert.Equal(t, "1", got["CPU_LIMIT"], "a set limit wins (250m rounds up to 1)")
}
