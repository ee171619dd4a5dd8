package main

import (
	"os"
	"testing"

	"github.com/opencontainers/cgroups"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func res(req, lim map[string]string) corev1.ResourceRequirements {
	conv := func(m map[string]string) corev1.ResourceList {
		if m == nil {
			return nil
		}
		out := corev1.ResourceList{}
		for k, v := range m {
			out[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return out
	}
	return corev1.ResourceRequirements{Requests: conv(req), Limits: conv(lim)}
}

func cgPod(inits []corev1.ResourceRequirements, ctrs ...corev1.ResourceRequirements) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1"}}
	for i, r := range inits {
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "i" + string(rune('a'+i)), Resources: r})
	}
	for i, r := range ctrs {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c" + string(rune('a'+i)), Resources: r})
	}
	return p
}

// TestResourceConfigForPod compares the pod cgroup values with the kubelet's
// formulas, written out by hand per case: shares = milliCPU*1024/1000 (min 2,
// max 262144), quota = milliCPU*period/1000 (min 1000 µs), memory = the limit.
func TestResourceConfigForPod(t *testing.T) {
	const period = 100000
	type want struct {
		qos    corev1.PodQOSClass
		shares uint64
		quota  *int64
		period bool
		memory *int64
	}
	tests := map[string]struct {
		pod     *corev1.Pod
		enforce bool
		want    want
	}{
		"BestEffort": {cgPod(nil, res(nil, nil)), true, want{qos: corev1.PodQOSBestEffort, shares: 2}},
		"Guaranteed 500m 64Mi": {cgPod(nil, res(map[string]string{"cpu": "500m", "memory": "64Mi"}, map[string]string{"cpu": "500m", "memory": "64Mi"})), true,
			want{qos: corev1.PodQOSGuaranteed, shares: 512, quota: ptr.To[int64](50000), period: true, memory: ptr.To[int64](64 << 20)}},
		"Guaranteed two containers sum": {cgPod(nil,
			res(map[string]string{"cpu": "1", "memory": "1Gi"}, map[string]string{"cpu": "1", "memory": "1Gi"}),
			res(map[string]string{"cpu": "250m", "memory": "128Mi"}, map[string]string{"cpu": "250m", "memory": "128Mi"})), true,
			want{qos: corev1.PodQOSGuaranteed, shares: 1280, quota: ptr.To[int64](125000), period: true, memory: ptr.To[int64](1<<30 + 128<<20)}},
		"Guaranteed cpuCFSQuota false": {cgPod(nil, res(map[string]string{"cpu": "2", "memory": "64Mi"}, map[string]string{"cpu": "2", "memory": "64Mi"})), false,
			want{qos: corev1.PodQOSGuaranteed, shares: 2048, quota: ptr.To[int64](-1), period: true, memory: ptr.To[int64](64 << 20)}},
		"Guaranteed tiny cpu: quota floor 1ms, shares floor 2": {cgPod(nil, res(map[string]string{"cpu": "1m", "memory": "8Mi"}, map[string]string{"cpu": "1m", "memory": "8Mi"})), true,
			want{qos: corev1.PodQOSGuaranteed, shares: 2, quota: ptr.To[int64](1000), period: true, memory: ptr.To[int64](8 << 20)}},
		"Burstable request only": {cgPod(nil, res(map[string]string{"cpu": "100m"}, nil)), true,
			want{qos: corev1.PodQOSBurstable, shares: 102}},
		"Burstable all limits declared": {cgPod(nil, res(map[string]string{"cpu": "100m", "memory": "32Mi"}, map[string]string{"cpu": "200m", "memory": "64Mi"})), true,
			want{qos: corev1.PodQOSBurstable, shares: 102, quota: ptr.To[int64](20000), period: true, memory: ptr.To[int64](64 << 20)}},
		"Burstable one container without limits": {cgPod(nil,
			res(map[string]string{"cpu": "100m"}, map[string]string{"cpu": "200m", "memory": "64Mi"}),
			res(map[string]string{"cpu": "300m"}, nil)), true,
			want{qos: corev1.PodQOSBurstable, shares: 409}},
		"Burstable memory limit only": {cgPod(nil, res(nil, map[string]string{"memory": "64Mi"})), true,
			want{qos: corev1.PodQOSBurstable, shares: 2, memory: ptr.To[int64](64 << 20)}},
		"Burstable init container larger than the app": {cgPod(
			[]corev1.ResourceRequirements{res(map[string]string{"cpu": "2"}, map[string]string{"cpu": "3", "memory": "10Mi"})},
			res(map[string]string{"cpu": "100m"}, map[string]string{"cpu": "1", "memory": "20Mi"})), true,
			want{qos: corev1.PodQOSBurstable, shares: 2048, quota: ptr.To[int64](300000), period: true, memory: ptr.To[int64](20 << 20)}},
		"Burstable shares capped at 262144": {cgPod(nil, res(map[string]string{"cpu": "300"}, nil)), true,
			want{qos: corev1.PodQOSBurstable, shares: 262144}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want.qos, podQOS(tc.pod))
			got := resourceConfigForPod(tc.pod, tc.enforce, period)
			if assert.NotNil(t, got.CPUShares) {
				assert.Equal(t, tc.want.shares, *got.CPUShares)
			}
			assert.Equal(t, tc.want.quota, got.CPUQuota)
			if tc.want.period {
				assert.Equal(t, ptr.To[uint64](period), got.CPUPeriod)
			} else {
				assert.Nil(t, got.CPUPeriod)
			}
			assert.Equal(t, tc.want.memory, got.Memory)
		})
	}
}

func TestBurstableAndNodeAllocatableConfig(t *testing.T) {
	pods := []*corev1.Pod{
		cgPod(nil, res(map[string]string{"cpu": "100m"}, nil)),
		cgPod(nil, res(map[string]string{"cpu": "250m", "memory": "1Mi"}, nil)),
		cgPod(nil, res(map[string]string{"cpu": "1", "memory": "1Mi"}, map[string]string{"cpu": "1", "memory": "1Mi"})), // Guaranteed: not counted
		cgPod(nil, res(nil, nil)), // BestEffort
	}
	assert.Equal(t, uint64(358), burstableShares(pods)) // 350m
	assert.Equal(t, uint64(2), burstableShares(nil))

	cfg := nodeAllocatableConfig(corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1500m"),
		corev1.ResourceMemory: resource.MustParse("2Gi"),
		pidResource:           resource.MustParse("4194304"),
	})
	assert.Equal(t, ptr.To[uint64](1536), cfg.CPUShares)
	assert.Equal(t, ptr.To[int64](2<<30), cfg.Memory)
	assert.Equal(t, ptr.To[int64](4194304), cfg.PidsLimit)
	assert.Nil(t, cfg.CPUQuota)
}

func TestPodCgroupNames(t *testing.T) {
	c := &podCgroups{root: "/kubepods", perQOS: true}
	g := cgPod(nil, res(map[string]string{"cpu": "1", "memory": "1Mi"}, map[string]string{"cpu": "1", "memory": "1Mi"}))
	b := cgPod(nil, res(map[string]string{"cpu": "1"}, nil))
	be := cgPod(nil, res(nil, nil))
	assert.Equal(t, "/kubepods/podu1", c.podName(g))
	assert.Equal(t, "/kubepods/burstable/podu1", c.podName(b))
	assert.Equal(t, "/kubepods/besteffort/podu1", c.podName(be))
	// The API server's qosClass wins over the computed one.
	be.Status.QOSClass = corev1.PodQOSBurstable
	assert.Equal(t, "/kubepods/burstable/podu1", c.podName(be))
	// cgroupsPerQOS false: every pod under the cgroup root, as the no-op manager.
	off := &podCgroups{root: "/", perQOS: false}
	assert.Equal(t, "/", off.podName(g))
}

func TestCgroupRootMustExist(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/cpu"); err != nil && !cgroups.IsCgroup2UnifiedMode() {
		t.Skip("no cgroup v1 cpu controller and no cgroup v2 here")
	}
	cfg := testConfig(t)
	cfg.CgroupRoot = "/nk-no-such-cgroup-root"
	_, err := newPodCgroups(cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), `cgroupRoot: cgroup "/nk-no-such-cgroup-root" has some missing paths`)
	cfg.CgroupRoot = "relative"
	_, err = newPodCgroups(cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), `cgroupRoot "relative" must be an absolute cgroupfs path`)
}
