package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

func TestLoadConfigDefaults(t *testing.T) {
	for name, path := range map[string]string{
		"no file":    "",
		"empty file": writeConfig(t, header),
	} {
		t.Run(name, func(t *testing.T) {
			cfg, ignored, err := loadConfig(path)
			require.NoError(t, err)
			assert.Empty(t, ignored)
			require.NoError(t, validateConfig(cfg))
			assert.Equal(t, 10*time.Second, cfg.NodeStatusUpdateFrequency.Duration)
			assert.Equal(t, 5*time.Minute, cfg.NodeStatusReportFrequency.Duration)
			assert.Equal(t, int32(40), cfg.NodeLeaseDurationSeconds)
			assert.Equal(t, int32(10248), *cfg.HealthzPort)
			assert.Equal(t, "127.0.0.1", cfg.HealthzBindAddress)
			assert.Equal(t, int32(10250), cfg.Port)
			assert.Equal(t, int32(110), cfg.MaxPods)
			assert.Equal(t, int32(50), *cfg.NodeStatusMaxImages)
			assert.Equal(t, "unix:///run/containerd/containerd.sock", cfg.ContainerRuntimeEndpoint)
			assert.Equal(t, "/var/log/pods", cfg.PodLogsDir)
			assert.Equal(t, 20*time.Second, cfg.FileCheckFrequency.Duration)
			assert.Equal(t, time.Minute, cfg.SyncFrequency.Duration)
			assert.Equal(t, 2*time.Minute, cfg.RuntimeRequestTimeout.Duration)
			assert.Equal(t, "/etc/resolv.conf", *cfg.ResolverConfig)
			assert.Equal(t, "cgroupfs", cfg.CgroupDriver)
			assert.True(t, *cfg.RegisterNode)
			assert.True(t, *cfg.SerializeImagePulls)
			assert.Equal(t, int32(85), *cfg.ImageGCHighThresholdPercent)
			assert.Equal(t, int32(80), *cfg.ImageGCLowThresholdPercent)
			assert.Equal(t, 2*time.Minute, cfg.ImageMinimumGCAge.Duration)
			assert.Zero(t, cfg.ImageMaximumGCAge.Duration)
			assert.Equal(t, map[string]string{
				"memory.available": "100Mi", "nodefs.available": "10%", "nodefs.inodesFree": "5%",
				"imagefs.available": "15%", "imagefs.inodesFree": "5%",
			}, cfg.EvictionHard)
		})
	}
}

// An explicit nodeStatusUpdateFrequency becomes the report frequency too, as upstream.
func TestLoadConfigReportFrequencyFollowsUpdateFrequency(t *testing.T) {
	cfg, _, err := loadConfig(writeConfig(t, header+"nodeStatusUpdateFrequency: 4s\n"))
	require.NoError(t, err)
	assert.Equal(t, 4*time.Second, cfg.NodeStatusUpdateFrequency.Duration)
	assert.Equal(t, 4*time.Second, cfg.NodeStatusReportFrequency.Duration)

	cfg, _, err = loadConfig(writeConfig(t, header+"nodeStatusUpdateFrequency: 4s\nnodeStatusReportFrequency: 1m\n"))
	require.NoError(t, err)
	assert.Equal(t, time.Minute, cfg.NodeStatusReportFrequency.Duration)
}

func TestLoadConfigFieldsKeptAndIgnored(t *testing.T) {
	cfg, ignored, err := loadConfig(writeConfig(t, header+`
staticPodPath: /etc/kubernetes/manifests
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
maxPods: 30
cpuManagerPolicy: static
topologyManagerPolicy: best-effort
evictionHard:
  memory.available: 200Mi
`))
	require.NoError(t, err)
	assert.Equal(t, []string{"cpuManagerPolicy", "topologyManagerPolicy"}, ignored)
	assert.Equal(t, "/etc/kubernetes/manifests", cfg.StaticPodPath)
	assert.Equal(t, []string{"10.96.0.10"}, cfg.ClusterDNS)
	assert.Equal(t, int32(30), cfg.MaxPods)
	// A configured evictionHard replaces the defaults, as upstream without mergeDefaultEvictionSettings.
	assert.Equal(t, map[string]string{"memory.available": "200Mi"}, cfg.EvictionHard)
}

func TestLoadConfigErrorsNameTheField(t *testing.T) {
	tests := map[string]struct{ body, want string }{
		"unknown field":    {header + "nodeStatusUpdateFrequncy: 4s\n", "nodeStatusUpdateFrequncy"},
		"wrong type":       {header + "maxPods: lots\n", "maxPods"},
		"bad duration":     {header + "syncFrequency: soon\n", "soon"},
		"wrong kind":       {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n", `kind "KubeProxyConfiguration"`},
		"wrong version":    {"apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n", `apiVersion "kubelet.config.k8s.io/v1"`},
		"not yaml":         {"{{{", "config.yaml"},
		"invalid healthz":  {header + "healthzPort: 70000\n", "healthzPort (--healthz-port) 70000"},
		"negative maxPods": {header + "maxPods: -1\n", "maxPods (--max-pods) -1"},
		"systemd cgroups":  {header + "cgroupDriver: systemd\n", `cgroupDriver "systemd"`},
		"bad clusterDNS":   {header + "clusterDNS: [not-an-ip]\n", `clusterDNS[0] "not-an-ip"`},
		"bad eviction":     {header + "evictionHard: {memory.available: 200%}\n", `evictionHard["memory.available"]`},
		"bad taint":        {header + "registerWithTaints: [{key: a, effect: Sometimes}]\n", `registerWithTaints[0]: invalid taint effect "Sometimes"`},
		"log max files":    {header + "containerLogMaxFiles: 1\n", "containerLogMaxFiles must be greater than 1"},
		"log max workers":  {header + "containerLogMaxWorkers: 0\n", "containerLogMaxWorkers must be greater than or equal to 1"},
		"log interval":     {header + "containerLogMonitorInterval: 2s\n", "containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"},
		"log max size":     {header + "containerLogMaxSize: lots\n", `containerLogMaxSize: failed to parse container log max size "lots"`},
		"gc high range":    {header + "imageGCHighThresholdPercent: 101\n", "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive"},
		"gc low range":     {header + "imageGCLowThresholdPercent: -1\n", "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) -1 must be between 0 and 100, inclusive"},
		"gc low >= high":   {header + "imageGCLowThresholdPercent: 90\n", "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 90 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 85"},
		"gc min age":       {header + "imageMinimumGCAge: -1s\n", "invalid configuration: imageMinimumGCAge -1s must not be negative"},
		"gc max age":       {header + "imageMaximumGCAge: 1m\n", "invalid configuration: imageMaximumGCAge 1m0s must be greater than imageMinimumGCAge 2m0s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, _, err := loadConfig(writeConfig(t, tc.body))
			if err == nil {
				err = validateConfig(cfg)
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidConfig), "want ErrInvalidConfig, got %v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestMissingConfigFile(t *testing.T) {
	_, _, err := loadConfig(filepath.Join(t.TempDir(), "nope.yaml"))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "nope.yaml")
}

func TestParseTaints(t *testing.T) {
	got, err := parseTaints("dedicated=infra:NoSchedule, gpu:NoExecute")
	require.NoError(t, err)
	assert.Equal(t, []corev1.Taint{
		{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule},
		{Key: "gpu", Effect: corev1.TaintEffectNoExecute},
	}, got)
	for _, bad := range []string{"noeffect", "a=b:Maybe", "bad key!:NoSchedule"} {
		_, err := parseTaints(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseNodeLabels(t *testing.T) {
	got, err := parseNodeLabels("tier=web,node.kubernetes.io/pool=a,example.com/x=y,topology.kubernetes.io/zone=z1")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"tier": "web", "node.kubernetes.io/pool": "a", "example.com/x": "y", "topology.kubernetes.io/zone": "z1"}, got)

	_, err = parseNodeLabels("node-role.kubernetes.io/worker=,tier=web")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [node-role.kubernetes.io/worker]")
	_, err = parseNodeLabels("novalue")
	assert.Error(t, err)
}

func TestBuildConfigFlagsOverrideFile(t *testing.T) {
	o := options{
		config:          writeConfig(t, header+"containerRuntimeEndpoint: unix:///file.sock\nregisterWithTaints: [{key: a, effect: NoSchedule}]\n"),
		runtimeEndpoint: "unix:///flag.sock", runtimeSet: true,
		registerTaints: "b=c:NoExecute", registerTaintsSet: true,
	}
	cfg, err := buildConfig(&o)
	require.NoError(t, err)
	assert.Equal(t, "unix:///flag.sock", cfg.ContainerRuntimeEndpoint)
	assert.Equal(t, []corev1.Taint{{Key: "b", Value: "c", Effect: corev1.TaintEffectNoExecute}}, cfg.RegisterWithTaints)

	// The deprecated container GC flags, with the kubelet's defaults.
	var gc options
	require.NoError(t, newFlagSet(&gc).Parse(nil))
	assert.Equal(t, options{rootDir: gc.rootDir, certDir: gc.certDir, maxDeadPerContainer: 1, maxDeadContainers: -1}, gc)
	require.NoError(t, newFlagSet(&gc).Parse([]string{"--minimum-container-ttl-duration=30s", "--maximum-dead-containers-per-container=3", "--maximum-dead-containers=50"}))
	assert.Equal(t, 30*time.Second, gc.minimumContainerTTL)
	assert.Equal(t, int32(3), gc.maxDeadPerContainer)
	assert.Equal(t, int32(50), gc.maxDeadContainers)

	o = options{nodeIP: "10.0.0.300"}
	_, err = buildConfig(&o)
	assert.ErrorContains(t, err, `--node-ip "10.0.0.300"`)
}

func TestHostname(t *testing.T) {
	h, err := hostnameFor("  Node-A ")
	require.NoError(t, err)
	assert.Equal(t, "node-a", h)
}
