package main_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestKubeletDownwardSysctlsTermination covers what the conformance specs on the
// downward API's default limits, pod sysctls and FallbackToLogsOnError check, on
// a real node: limits.* without a limit read the node's allocatable (env and
// downwardAPI volume), allowed sysctls reach the pod's namespaces and others
// reject the pod with SysctlForbidden, and a failed container's unterminated
// last output line is its termination message.
func TestKubeletDownwardSysctlsTermination(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNodeWithConfig(t, cp, "nk-node-dapi", true, "allowedUnsafeSysctls: [\"kernel.msg*\"]\n")
	node := n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	image := n.ctd.BusyboxImage()
	terminated := func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated != nil
	}

	t.Run("limits without a limit read the node's allocatable", func(t *testing.T) {
		cpu := node.Status.Allocatable[corev1.ResourceCPU]
		mem := node.Status.Allocatable[corev1.ResourceMemory]
		want := strconv.FormatInt((cpu.MilliValue()+999)/1000, 10) + " " + strconv.FormatInt(mem.Value(), 10)
		p := busyboxPod("dapi", image, corev1.RestartPolicyNever,
			`printf '%s %s|%s %s' "$CPU_LIMIT" "$MEMORY_LIMIT" "$(cat /etc/podinfo/cpu_limit)" "$(cat /etc/podinfo/memory_limit)" > /dev/termination-log`)
		c := &p.Spec.Containers[0]
		field := func(res string) *corev1.ResourceFieldSelector {
			return &corev1.ResourceFieldSelector{ContainerName: "main", Resource: res}
		}
		c.Env = []corev1.EnvVar{
			{Name: "CPU_LIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: field("limits.cpu")}},
			{Name: "MEMORY_LIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: field("limits.memory")}},
		}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "podinfo", MountPath: "/etc/podinfo"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{
				{Path: "cpu_limit", ResourceFieldRef: field("limits.cpu")},
				{Path: "memory_limit", ResourceFieldRef: field("limits.memory")},
			},
		}}}}
		n.createPod(t, p)
		got := n.waitPod(t, "dapi", 60*time.Second, "terminated", terminated)
		assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
		assert.Equal(t, want+"|"+want, got.Status.ContainerStatuses[0].State.Terminated.Message, "env|volume")
	})

	t.Run("allowed sysctls are set in the pod", func(t *testing.T) {
		p := busyboxPod("sysctl", image, corev1.RestartPolicyNever,
			"cat /proc/sys/kernel/shm_rmid_forced /proc/sys/kernel/msgmax | tr '\\n' ' ' > /dev/termination-log")
		p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
			{Name: "kernel/shm_rmid_forced", Value: "1"}, // safe, slash-separated
			{Name: "kernel.msgmax", Value: "10000"},      // unsafe, allowed by kernel.msg*
		}}
		n.createPod(t, p)
		got := n.waitPod(t, "sysctl", 60*time.Second, "terminated", terminated)
		assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
		assert.Equal(t, "1 10000 ", got.Status.ContainerStatuses[0].State.Terminated.Message)
	})

	t.Run("a sysctl the node does not allow rejects the pod", func(t *testing.T) {
		// (A host-network pod with a network sysctl never gets here: the API
		// server refuses it; the unit tests cover the kubelet's own check.)
		const message = `forbidden sysctl: "kernel.sem" not allowlisted`
		p := busyboxPod("forbidden", image, corev1.RestartPolicyNever, "true")
		p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.sem", Value: "250 32000 32 128"}}}
		n.createPod(t, p)
		got := n.waitPod(t, "forbidden", 30*time.Second, "rejected", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		assert.Equal(t, "SysctlForbidden", got.Status.Reason)
		assert.Equal(t, "Pod was rejected: "+message, got.Status.Message)
		assert.Empty(t, n.runtimeContainers(t, got.UID), "nothing started")
		eventually(t, 10*time.Second, "the SysctlForbidden event", func() (bool, string) {
			return hasEvent(n.events(t, "forbidden"), "SysctlForbidden", message), ""
		})
	})

	t.Run("FallbackToLogsOnError takes an unterminated last line", func(t *testing.T) {
		p := busyboxPod("fallback", image, corev1.RestartPolicyNever, "echo first; echo -n DONE; exit 1")
		p.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
		n.createPod(t, p)
		got := n.waitPod(t, "fallback", 60*time.Second, "terminated", terminated)
		assert.Equal(t, corev1.PodFailed, got.Status.Phase)
		st := got.Status.ContainerStatuses[0].State.Terminated
		assert.EqualValues(t, 1, st.ExitCode)
		assert.Equal(t, "first\nDONE", st.Message)
	})
}
