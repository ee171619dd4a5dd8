package cri_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/cri"
)

// Slash-separated sysctl names reach the runtime dot-separated, as the kubelet
// converts them (sysctl.ConvertPodSysctlsVariableToDotsSeparator).
func TestSandboxSysctlsDotSeparated(t *testing.T) {
	pod := testPod()
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
		{Name: "kernel/shm_rmid_forced", Value: "1"},
		{Name: "net/ipv4/conf/eth0.1/forwarding", Value: "0"},
		{Name: "net.ipv4.conf.eth0/2.forwarding", Value: "0"}, // dots first: kept as written
		{Name: "net.ipv4.ip_local_port_range", Value: "1024 65000"},
	}}
	cfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{
		"kernel.shm_rmid_forced":          "1",
		"net.ipv4.conf.eth0/1.forwarding": "0",
		"net.ipv4.conf.eth0/2.forwarding": "0",
		"net.ipv4.ip_local_port_range":    "1024 65000",
	}, cfg.Linux.Sysctls)
}
