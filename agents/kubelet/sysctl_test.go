package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func sysctlPod(hostNet bool, sysctls ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sysctl", Namespace: "team", UID: "uid-sysctl"},
		Spec: corev1.PodSpec{HostNetwork: hostNet, SecurityContext: &corev1.PodSecurityContext{}}}
	for _, s := range sysctls {
		p.Spec.SecurityContext.Sysctls = append(p.Spec.SecurityContext.Sysctls, corev1.Sysctl{Name: s, Value: "1"})
	}
	return p
}

func TestSysctlAdmissionAsTheKubelet(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	ns.cfg.AllowedUnsafeSysctls = []string{"net.core.*", "kernel.msgmax"}
	list, err := newPodSysctlAllowlist(podManagerConfig{cfg: ns.cfg, node: ns})
	require.NoError(t, err)
	m := &podManager{cfg: podManagerConfig{node: ns}, pods: map[k8stypes.UID]*podEntry{}, sysctls: list}

	for _, tc := range []struct {
		pod     *corev1.Pod
		message string // "" means admitted
	}{
		{sysctlPod(false), ""},
		{sysctlPod(false, "kernel.shm_rmid_forced", "net.ipv4.tcp_rmem"), ""},
		{sysctlPod(false, "kernel/shm_rmid_forced"), ""},
		{sysctlPod(false, "net.core.somaxconn", "kernel.msgmax"), ""},
		{sysctlPod(false, "kernel.shm_rmid_forced", "kernel.msgmnb"), `forbidden sysctl: "kernel.msgmnb" not allowlisted`},
		{sysctlPod(false, "kernel/sem"), `forbidden sysctl: "kernel.sem" not allowlisted`},
		{sysctlPod(true, "net.core.somaxconn"), `forbidden sysctl: "net.core.somaxconn" not allowed with host Net enabled`},
		{sysctlPod(true, "kernel.shm_rmid_forced"), ""},
	} {
		reason, msg, ok := m.admit(tc.pod)
		if tc.message == "" {
			assert.True(t, ok, "%v: %s", tc.pod.Spec.SecurityContext.Sysctls, msg)
			continue
		}
		assert.False(t, ok, "%v", tc.pod.Spec.SecurityContext.Sysctls)
		assert.Equal(t, "SysctlForbidden", reason)
		assert.Equal(t, tc.message, msg)
	}

	// A pod sharing the host's IPC namespace may not set an IPC sysctl.
	ipc := sysctlPod(false, "kernel.shm_rmid_forced")
	ipc.Spec.HostIPC = true
	_, msg, ok := m.admit(ipc)
	assert.False(t, ok)
	assert.Equal(t, `forbidden sysctl: "kernel.shm_rmid_forced" not allowed with host IPC enabled`, msg)

	// Without the allowlist (the default config) an unsafe sysctl is refused.
	ns.cfg.AllowedUnsafeSysctls = nil
	m.sysctls, err = newPodSysctlAllowlist(podManagerConfig{cfg: ns.cfg, node: ns})
	require.NoError(t, err)
	reason, msg, ok := m.admit(sysctlPod(false, "kernel.msgmax"))
	assert.False(t, ok)
	assert.Equal(t, "SysctlForbidden", reason)
	assert.Equal(t, `forbidden sysctl: "kernel.msgmax" not allowlisted`, msg)
}

func TestSafeSysctlsFollowTheKernel(t *testing.T) {
	assert.Contains(t, safeSysctlList("6.18.0-nodekit"), "net.ipv4.tcp_rmem")
	old := safeSysctlList("4.4.0-generic")
	assert.Contains(t, old, "net.ipv4.ip_local_reserved_ports")
	assert.NotContains(t, old, "net.ipv4.tcp_keepalive_time")
	assert.Equal(t, []string{"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
		"net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"}, safeSysctlList("unknown"))
}

func TestAllowedUnsafeSysctlsValidated(t *testing.T) {
	for pattern, want := range map[string]string{
		"net.core.*":     "",
		"kernel/msg*":    "",
		"Kernel.msgmax":  `sysctl "Kernel.msgmax" must have at most 253 characters`,
		"net..core":      `sysctl "net..core" must have at most 253 characters`,
		"vm.swappiness":  `the sysctls "vm.swappiness" are not known to be namespaced`,
		"kernel.pid_max": `the sysctls "kernel.pid_max" are not known to be namespaced`,
	} {
		_, err := newSysctlAllowlist([]string{pattern})
		if want == "" {
			assert.NoError(t, err, pattern)
			continue
		}
		require.Error(t, err, pattern)
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), want)
	}
}
