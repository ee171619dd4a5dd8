package cri_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/cri"
)

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "web",
			Namespace:   "default",
			UID:         "0f5c2b1e-8d5a-4a57-9a43-6c4f3f7b2a10",
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"team": "edge"},
		},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers: []corev1.Container{{
				Name:                     "nginx",
				Image:                    "docker.io/library/nginx:1.27",
				Command:                  []string{"/bin/sh", "-c"},
				Args:                     []string{"echo $(GREETING) $$HOME $(UNSET)"},
				Env:                      []corev1.EnvVar{{Name: "WHO", Value: "world"}, {Name: "GREETING", Value: "hello $(WHO)"}, {Name: "FROM_API", ValueFrom: &corev1.EnvVarSource{}}},
				Ports:                    []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}},
				TerminationMessagePath:   "/dev/termination-log",
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
					Exec: &corev1.ExecAction{Command: []string{"nginx", "-s", "quit"}},
				}},
			}},
		},
	}
}

func TestPodSandboxConfig(t *testing.T) {
	pod := testPod()
	got, err := cri.PodSandboxConfig(pod, cri.PodOptions{Attempt: 2, CgroupParent: "/kubepods/pod0f5c"})
	require.NoError(t, err)
	want := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: string(pod.UID), Attempt: 2},
		Hostname: "web",
		Labels: map[string]string{
			"app":                         "web",
			"io.kubernetes.pod.name":      "web",
			"io.kubernetes.pod.namespace": "default",
			"io.kubernetes.pod.uid":       string(pod.UID),
		},
		Annotations:  map[string]string{"team": "edge"},
		LogDirectory: "/var/log/pods/default_web_" + string(pod.UID),
		PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80}},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/kubepods/pod0f5c",
			Sysctls:      map[string]string{},
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD},
				Seccomp:          &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
			},
		},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("PodSandboxConfig (-want +got):\n%s", diff)
	}
	// The pod's own maps are not shared with the config.
	got.Labels["x"] = "y"
	got.Annotations["x"] = "y"
	assert.NotContains(t, pod.Labels, "x")
	assert.NotContains(t, pod.Annotations, "x")
}

func TestPodSandboxConfigVariants(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*corev1.Pod)
		opts  cri.PodOptions
		check func(t *testing.T, cfg *runtimeapi.PodSandboxConfig)
	}{
		{
			name: "host network has no hostname",
			edit: func(p *corev1.Pod) { p.Spec.HostNetwork, p.Spec.HostPID, p.Spec.HostIPC = true, true, true },
			check: func(t *testing.T, cfg *runtimeapi.PodSandboxConfig) {
				assert.Empty(t, cfg.Hostname, "runc refuses a hostname in the host's UTS namespace")
				ns := cfg.Linux.SecurityContext.NamespaceOptions
				assert.Equal(t, runtimeapi.NamespaceMode_NODE, ns.Network)
				assert.Equal(t, runtimeapi.NamespaceMode_NODE, ns.Pid)
				assert.Equal(t, runtimeapi.NamespaceMode_NODE, ns.Ipc)
			},
		},
		{
			name: "shared process namespace",
			edit: func(p *corev1.Pod) { p.Spec.ShareProcessNamespace = ptr.To(true) },
			check: func(t *testing.T, cfg *runtimeapi.PodSandboxConfig) {
				assert.Equal(t, runtimeapi.NamespaceMode_POD, cfg.Linux.SecurityContext.NamespaceOptions.Pid)
			},
		},
		{
			name: "long name is cut to 63 without a trailing dash",
			edit: func(p *corev1.Pod) { p.Name = strings.Repeat("a", 62) + "-bcd" },
			check: func(t *testing.T, cfg *runtimeapi.PodSandboxConfig) {
				assert.Equal(t, strings.Repeat("a", 62), cfg.Hostname)
			},
		},
		{
			name: "spec.hostname wins; FQDN with subdomain and cluster domain",
			edit: func(p *corev1.Pod) {
				p.Spec.Hostname, p.Spec.Subdomain, p.Spec.SetHostnameAsFQDN = "db-0", "db", ptr.To(true)
			},
			opts: cri.PodOptions{ClusterDomain: "cluster.local", LogsDir: "/logs"},
			check: func(t *testing.T, cfg *runtimeapi.PodSandboxConfig) {
				assert.Equal(t, "db-0.db.default.svc.cluster.local", cfg.Hostname)
				assert.Equal(t, "/logs/default_web_0f5c2b1e-8d5a-4a57-9a43-6c4f3f7b2a10", cfg.LogDirectory)
			},
		},
		{
			name: "spec.hostnameOverride wins over hostname and FQDN",
			edit: func(p *corev1.Pod) {
				p.Spec.Hostname, p.Spec.Subdomain, p.Spec.SetHostnameAsFQDN = "db-0", "db", ptr.To(true)
				p.Spec.HostnameOverride = ptr.To("custom.host.example")
			},
			opts: cri.PodOptions{ClusterDomain: "cluster.local", LogsDir: "/logs"},
			check: func(t *testing.T, cfg *runtimeapi.PodSandboxConfig) {
				assert.Equal(t, "custom.host.example", cfg.Hostname)
			},
		},
		{
			name: "security context, privileged container, sysctls",
			edit: func(p *corev1.Pod) {
				p.Spec.SecurityContext = &corev1.PodSecurityContext{
					RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](2000), FSGroup: ptr.To[int64](3000),
					SupplementalGroups: []int64{4000}, Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}},
				}
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
			},
			check: func(t *testing.T, cfg *runtimeapi.PodSandboxConfig) {
				sc := cfg.Linux.SecurityContext
				assert.True(t, sc.Privileged)
				assert.Equal(t, int64(1000), sc.RunAsUser.GetValue())
				assert.Equal(t, int64(2000), sc.RunAsGroup.GetValue())
				assert.Equal(t, []int64{3000, 4000}, sc.SupplementalGroups, "fsGroup first, as the kubelet")
				assert.Equal(t, map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}, cfg.Linux.Sysctls)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod()
			tt.edit(pod)
			cfg, err := cri.PodSandboxConfig(pod, tt.opts)
			require.NoError(t, err)
			tt.check(t, cfg)
		})
	}
}

func TestInvalidPods(t *testing.T) {
	_, err := cri.PodSandboxConfig(nil, cri.PodOptions{})
	require.ErrorIs(t, err, cri.ErrInvalidPod)
	noUID := testPod()
	noUID.UID = ""
	_, err = cri.PodSandboxConfig(noUID, cri.PodOptions{})
	require.ErrorIs(t, err, cri.ErrInvalidPod)
	assert.Contains(t, err.Error(), `"default/web"`)
	_, err = cri.ContainerConfig(testPod(), "sidecar", 0, "")
	require.ErrorIs(t, err, cri.ErrInvalidPod)
	assert.Contains(t, err.Error(), `no container named "sidecar"`)
	_, err = cri.ContainerConfig(testPod(), "nginx", -1, "")
	require.ErrorIs(t, err, cri.ErrInvalidPod)
	fqdn := testPod()
	fqdn.Spec.Hostname, fqdn.Spec.Subdomain, fqdn.Spec.SetHostnameAsFQDN = strings.Repeat("h", 40), "sub", ptr.To(true)
	_, err = cri.PodSandboxConfig(fqdn, cri.PodOptions{ClusterDomain: "cluster.local"})
	require.ErrorIs(t, err, cri.ErrInvalidPod)
	assert.Contains(t, err.Error(), "longer than 64")
}

func TestContainerConfig(t *testing.T) {
	pod := testPod()
	got, err := cri.ContainerConfig(pod, "nginx", 3, "sha256:abc")
	require.NoError(t, err)
	hash := got.Annotations[cri.AnnotationContainerHash]
	require.NotEmpty(t, hash)
	want := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "nginx", Attempt: 3},
		Image:    &runtimeapi.ImageSpec{Image: "sha256:abc", UserSpecifiedImage: "docker.io/library/nginx:1.27"},
		Command:  []string{"/bin/sh", "-c"},
		Args:     []string{"echo hello world $HOME $(UNSET)"},
		Labels: map[string]string{
			"io.kubernetes.pod.name":       "web",
			"io.kubernetes.pod.namespace":  "default",
			"io.kubernetes.pod.uid":        string(pod.UID),
			"io.kubernetes.container.name": "nginx",
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     hash,
			"io.kubernetes.container.restartCount":             "3",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
			"io.kubernetes.container.preStopHandler":           `{"exec":{"command":["nginx","-s","quit"]}}`,
			"io.kubernetes.container.ports":                    `[{"name":"http","containerPort":80,"protocol":"TCP"}]`,
		},
		Envs:    []*runtimeapi.KeyValue{{Key: "WHO", Value: []byte("world")}, {Key: "GREETING", Value: []byte("hello world")}},
		LogPath: "nginx/3.log",
		Linux: &runtimeapi.LinuxContainerConfig{
			// No requests or limits: the kubelet's minimum shares and no quota.
			Resources: &runtimeapi.LinuxContainerResources{CpuShares: 2, CpuPeriod: 100000},
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD},
			},
		},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("ContainerConfig (-want +got):\n%s", diff)
	}

	unresolved, err := cri.ContainerConfig(pod, "nginx", 0, "")
	require.NoError(t, err)
	assert.Equal(t, "docker.io/library/nginx:1.27", unresolved.Image.Image, "without a resolved ref the image goes as written")
	assert.Equal(t, "nginx/0.log", unresolved.LogPath)
}

func TestContainerConfigResources(t *testing.T) {
	q := resource.MustParse
	tests := []struct {
		name      string
		resources corev1.ResourceRequirements
		want      *runtimeapi.LinuxContainerResources
	}{
		{"none", corev1.ResourceRequirements{},
			&runtimeapi.LinuxContainerResources{CpuShares: 2, CpuPeriod: 100000}},
		{"burstable", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("250m"), corev1.ResourceMemory: q("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("500m"), corev1.ResourceMemory: q("128Mi")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 256, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 128 << 20}},
		{"limit only: the request defaults to it", corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("1G")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 2048, CpuQuota: 200000, CpuPeriod: 100000, MemoryLimitInBytes: 1e9}},
		{"request only", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("100m")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 102, CpuPeriod: 100000}},
		{"explicit zero request keeps the minimum", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("0")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("1")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 2, CpuQuota: 100000, CpuPeriod: 100000}},
		{"tiny limit: quota at least 1ms", corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: q("5m")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 5, CpuQuota: 1000, CpuPeriod: 100000}},
		{"tiny request: at least 2 shares", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("1m")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 2, CpuPeriod: 100000}},
		{"huge request: at most 262144 shares", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("300")},
		}, &runtimeapi.LinuxContainerResources{CpuShares: 262144, CpuPeriod: 100000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod()
			pod.Spec.Containers[0].Resources = tt.resources
			got, err := cri.ContainerConfig(pod, "nginx", 0, "")
			require.NoError(t, err)
			if diff := cmp.Diff(tt.want, got.GetLinux().GetResources(), protocmp.Transform()); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}
		})
	}
}

func TestContainerConfigSecurityAndEnv(t *testing.T) {
	pod := testPod()
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsUser: ptr.To[int64](1000), FSGroup: ptr.To[int64](2000), SupplementalGroups: []int64{3000, 3001},
	}
	c := &pod.Spec.Containers[0]
	c.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), RunAsUser: ptr.To[int64](1001)}
	c.Env = []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "$(A)"}, {Name: "A", Value: "2"}, {Name: "C", Value: "$(A)"}}
	c.WorkingDir = "/srv"
	got, err := cri.ContainerConfig(pod, "nginx", 0, "")
	require.NoError(t, err)
	sc := got.GetLinux().GetSecurityContext()
	assert.True(t, sc.GetNoNewPrivs(), "allowPrivilegeEscalation: false sets no_new_privs")
	assert.Equal(t, int64(1001), sc.GetRunAsUser().GetValue(), "the container's user wins over the pod's")
	assert.Equal(t, []int64{2000, 3000, 3001}, sc.GetSupplementalGroups(), "fsGroup first, then the pod's groups")
	assert.Equal(t, "/srv", got.GetWorkingDir())
	assert.Equal(t, []*runtimeapi.KeyValue{{Key: "A", Value: []byte("2")}, {Key: "B", Value: []byte("1")}, {Key: "C", Value: []byte("2")}},
		got.GetEnvs(), "a repeated name keeps its last value; references see the value defined before them")

	c.SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	got, err = cri.ContainerConfig(pod, "nginx", 0, "")
	require.NoError(t, err)
	assert.False(t, got.GetLinux().GetSecurityContext().GetNoNewPrivs())
	c.SecurityContext.AllowPrivilegeEscalation = nil
	got, err = cri.ContainerConfig(pod, "nginx", 0, "")
	require.NoError(t, err)
	assert.False(t, got.GetLinux().GetSecurityContext().GetNoNewPrivs(), "unset: the runtime's default")
}

func TestContainerHash(t *testing.T) {
	base := corev1.Container{Name: "nginx", Image: "nginx:1.27"}
	h := cri.ContainerHash(&base)
	assert.Equal(t, h, cri.ContainerHash(&corev1.Container{Name: "nginx", Image: "nginx:1.27", Args: []string{"x"}}),
		"only name and image count, as the kubelet's hash")
	assert.NotEqual(t, h, cri.ContainerHash(&corev1.Container{Name: "nginx", Image: "nginx:1.28"}))
	assert.NotEqual(t, h, cri.ContainerHash(&corev1.Container{Name: "web", Image: "nginx:1.27"}))
	assert.LessOrEqual(t, h, uint64(1<<32-1), "a 32-bit FNV hash")
}

func TestContainerConfigEphemeral(t *testing.T) {
	pod := testPod()
	pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debugger", Image: "busybox:1.36", Command: []string{"sh"}, Stdin: true, TTY: true,
		},
		TargetContainerName: "nginx",
	}}
	got, err := cri.ContainerConfig(pod, "debugger", 0, "")
	require.NoError(t, err)
	assert.Equal(t, "debugger", got.Metadata.Name)
	assert.Equal(t, "debugger", got.Labels["io.kubernetes.container.name"])
	assert.Equal(t, "busybox:1.36", got.Image.Image)
	assert.Equal(t, []string{"sh"}, got.Command)
	assert.True(t, got.Stdin)
	assert.True(t, got.Tty)
	assert.Equal(t, "debugger/0.log", got.LogPath)
	// The target's PID namespace needs the target's runtime ID, which the caller
	// sets; the config itself keeps the pod's modes.
	assert.Equal(t, runtimeapi.NamespaceMode_CONTAINER, got.Linux.SecurityContext.NamespaceOptions.Pid)

	_, err = cri.ContainerConfig(pod, "nope", 0, "")
	require.ErrorIs(t, err, cri.ErrInvalidPod)
}
