package stats_test

// A real containerd (internal/testenv/containerd) runs a pod that burns a fifth of
// a core and fills 48 MiB of memory; both endpoints must show it.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/stats"
	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
)

const mib = 1 << 20

func TestContainerdStats(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{})
	c, err := cri.New(context.Background(), cri.Config{Endpoint: rt.Endpoint(), CallTimeout: 30 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	// containerd 1.6 answers ListPodSandboxStats but fails it whole for a sandbox
	// without a cgroup parent (nodekit's kubelet sets none yet): the provider then
	// sums the containers. With a cgroup parent the pod figures are the runtime's.
	t.Run("no cgroup parent", func(t *testing.T) { testBurner(t, rt, c, "") })
	t.Run("cgroup parent", func(t *testing.T) {
		parent := "/nodekit-stats-test-" + strconv.Itoa(os.Getpid())
		t.Cleanup(func() { removeCgroups(t, parent) })
		testBurner(t, rt, c, parent+"/poduid-burner")
	})
}

// removeCgroups removes the cgroup folders runc created for parent (it removes a
// container's own cgroup, not the parents it made), deepest first.
func removeCgroups(t *testing.T, parent string) {
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/*", "/sys/fs/cgroup/unified"} {
		dirs, _ := filepath.Glob(filepath.Join(root, parent))
		for _, dir := range dirs {
			var all []string
			_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					all = append(all, path)
				}
				return nil
			})
			for i := len(all) - 1; i >= 0; i-- {
				if err := os.Remove(all[i]); err != nil {
					t.Logf("remove cgroup %s: %v", all[i], err)
				}
			}
		}
	}
}

func testBurner(t *testing.T, rt *containerd.Containerd, c *cri.Client, cgroupParent string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "burner", Namespace: "stats-test", UID: types.UID("uid-burner")},
		Spec: corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{{
			Name:  "main",
			Image: rt.BusyboxImage(),
			// 48 MiB in the pod's shm (anonymous, so in the working set), then a
			// busy loop held to 200m by its CFS quota.
			Command: []string{"sh", "-c", "head -c 50331648 /dev/zero > /dev/shm/fill; while :; do :; done"},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("200m"),
				corev1.ResourceMemory: resource.MustParse("256Mi"),
			}},
		}}},
	}
	logsDir := t.TempDir()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: logsDir, CgroupParent: cgroupParent})
	require.NoError(t, err)
	sandboxID, err := c.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(t, err)
	ctrCfg, err := cri.ContainerConfig(pod, "main", 0, rt.BusyboxImage())
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(sbCfg.LogDirectory, "main"), 0o755))
	containerID, err := c.CreateContainer(ctx, sandboxID, ctrCfg, sbCfg)
	require.NoError(t, err)
	require.NoError(t, c.StartContainer(ctx, containerID))
	defer func() {
		ctx := context.Background()
		assert.NoError(t, c.StopContainer(ctx, containerID, 0))
		assert.NoError(t, c.StopPodSandbox(ctx, sandboxID))
		assert.NoError(t, c.RemovePodSandbox(ctx, sandboxID))
	}()

	runtime := stats.CRIRuntime(c)
	sbStats, sbErr := runtime.ListPodSandboxStats(ctx, nil)
	t.Logf("containerd %s: ListPodSandboxStats: %d, %v", c.RuntimeVersion().GetRuntimeVersion(), len(sbStats), sbErr)
	if cgroupParent == "" {
		require.Error(t, sbErr)
		assert.Contains(t, sbErr.Error(), "cgroupPath is empty")
	} else {
		require.NoError(t, sbErr)
		require.Len(t, sbStats, 1)
	}

	p, err := stats.New(stats.Config{Runtime: runtime, NodeName: "stats-node", RootDir: t.TempDir(), PodLogsDir: logsDir})
	require.NoError(t, err)
	summaryH, metricsH := p.SummaryHandler(), p.ResourceMetricsHandler()

	getSummary := func(query string) *statsapi.Summary {
		t.Helper()
		rec := httptest.NewRecorder()
		start := time.Now()
		summaryH.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/stats/summary"+query, nil))
		t.Logf("GET /stats/summary%s took %s", query, time.Since(start).Round(time.Microsecond))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var s statsapi.Summary
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
		return &s
	}
	findPod := func(s *statsapi.Summary) *statsapi.PodStats {
		for i := range s.Pods {
			if s.Pods[i].PodRef.Name == "burner" {
				return &s.Pods[i]
			}
		}
		return nil
	}

	// Wait for the memory fill and some CPU time.
	var ps *statsapi.PodStats
	require.Eventually(t, func() bool {
		ps = findPod(getSummaryQuiet(t, ctx, p))
		if cgroupParent != "" && (ps == nil || ps.Memory == nil || ps.Memory.WorkingSetBytes == nil || *ps.Memory.WorkingSetBytes < 48*mib) {
			return false
		}
		return ps != nil && len(ps.Containers) == 1 &&
			ps.Containers[0].Memory != nil && ps.Containers[0].Memory.WorkingSetBytes != nil && *ps.Containers[0].Memory.WorkingSetBytes > 48*mib &&
			ps.Containers[0].CPU != nil && ps.Containers[0].CPU.UsageCoreNanoSeconds != nil && *ps.Containers[0].CPU.UsageCoreNanoSeconds > uint64(100*time.Millisecond)
	}, 30*time.Second, 250*time.Millisecond, "the pod shows 48 MiB and 0.1 s of CPU")
	time.Sleep(time.Second) // a second sample apart, for usageNanoCores

	s := getSummary("")
	raw, _ := json.Marshal(s)
	t.Logf("summary: %s", raw)
	ps = findPod(s)
	require.NotNil(t, ps)
	assert.Equal(t, statsapi.PodReference{Name: "burner", Namespace: "stats-test", UID: "uid-burner"}, ps.PodRef)
	require.Len(t, ps.Containers, 1)
	ctr := ps.Containers[0]
	assert.Equal(t, "main", ctr.Name)
	assert.WithinDuration(t, time.Now(), ctr.StartTime.Time, time.Minute)
	ws := *ctr.Memory.WorkingSetBytes
	assert.Greater(t, ws, uint64(48*mib))
	assert.Less(t, ws, uint64(256*mib))
	require.NotNil(t, ctr.CPU.UsageNanoCores)
	// The quota holds the loop to 0.2 cores; allow for a loaded machine.
	assert.Greater(t, *ctr.CPU.UsageNanoCores, uint64(20_000_000))
	assert.Less(t, *ctr.CPU.UsageNanoCores, uint64(300_000_000))
	require.NotNil(t, ctr.Rootfs)
	require.NotNil(t, ctr.Rootfs.UsedBytes)
	assert.NotNil(t, ctr.Rootfs.CapacityBytes)
	require.NotNil(t, ctr.Logs)
	require.NotNil(t, ps.CPU)
	require.NotNil(t, ps.Memory)
	assert.GreaterOrEqual(t, *ps.CPU.UsageCoreNanoSeconds, *ctr.CPU.UsageCoreNanoSeconds)
	assert.GreaterOrEqual(t, *ps.Memory.WorkingSetBytes, uint64(48*mib))
	require.NotNil(t, ps.EphemeralStorage)

	n := s.Node
	assert.Equal(t, "stats-node", n.NodeName)
	assert.Greater(t, *n.CPU.UsageCoreNanoSeconds, *ps.CPU.UsageCoreNanoSeconds)
	assert.Greater(t, *n.Memory.WorkingSetBytes, *ps.Memory.WorkingSetBytes)
	assert.Greater(t, *n.Fs.CapacityBytes, uint64(0))
	require.NotNil(t, n.Runtime)
	require.NotNil(t, n.Runtime.ImageFs)
	// containerd 1.6 sums snapshot usage every 10 s, so a fresh one may say 0.
	assert.NotNil(t, n.Runtime.ImageFs.UsedBytes)
	assert.Greater(t, *n.Runtime.ImageFs.CapacityBytes, uint64(0))
	assert.Greater(t, *n.Rlimit.MaxPID, int64(0))

	trimmed := getSummary("?only_cpu_and_memory=true")
	assert.Nil(t, trimmed.Node.Fs)
	tp := findPod(trimmed)
	require.NotNil(t, tp)
	assert.Nil(t, tp.Containers[0].Rootfs)
	assert.GreaterOrEqual(t, *tp.Containers[0].CPU.UsageCoreNanoSeconds, *ctr.CPU.UsageCoreNanoSeconds)

	scrape := func() map[string]sample {
		t.Helper()
		rec := httptest.NewRecorder()
		start := time.Now()
		metricsH.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/metrics/resource", nil))
		t.Logf("GET /metrics/resource took %s", time.Since(start).Round(time.Microsecond))
		require.Equal(t, http.StatusOK, rec.Code)
		out := map[string]sample{}
		for _, smp := range parseSamples(t, rec.Body.String()) {
			if smp.labels == "" || strings.Contains(smp.labels, `pod="burner"`) {
				out[smp.name] = smp
			}
		}
		return out
	}
	first := scrape()
	for _, name := range []string{"node_cpu_usage_seconds_total", "node_memory_working_set_bytes", "container_cpu_usage_seconds_total",
		"container_memory_working_set_bytes", "container_start_time_seconds", "pod_cpu_usage_seconds_total", "pod_memory_working_set_bytes", "resource_scrape_error"} {
		require.Contains(t, first, name)
		t.Logf("%s{%s} %g @%s", name, first[name].labels, first[name].value, first[name].time.Format(time.RFC3339Nano))
	}
	assert.Equal(t, `container="main",namespace="stats-test",pod="burner"`, first["container_cpu_usage_seconds_total"].labels)
	assert.Greater(t, first["container_cpu_usage_seconds_total"].value, 0.1)
	assert.Greater(t, first["container_memory_working_set_bytes"].value, float64(48*mib))
	assert.Greater(t, first["pod_memory_working_set_bytes"].value, float64(48*mib))
	assert.Equal(t, 0.0, first["resource_scrape_error"].value)
	assert.WithinDuration(t, time.Now(), first["container_cpu_usage_seconds_total"].time, 30*time.Second)
	assert.InDelta(t, float64(time.Now().Unix()), first["container_start_time_seconds"].value, 60)

	time.Sleep(time.Second)
	second := scrape()
	for _, name := range []string{"container_cpu_usage_seconds_total", "pod_cpu_usage_seconds_total", "node_cpu_usage_seconds_total"} {
		assert.Greater(t, second[name].value, first[name].value, name)
	}
}

func getSummaryQuiet(t *testing.T, ctx context.Context, p *stats.Provider) *statsapi.Summary {
	s, err := p.CPUAndMemory(ctx)
	require.NoError(t, err)
	return s
}

// sample is one line of the Prometheus text format.
type sample struct {
	name, labels string // labels as written, without braces
	value        float64
	time         time.Time // zero without a timestamp
}

// parseSamples reads the sample lines of a Prometheus text exposition, failing on
// lines it does not understand.
func parseSamples(t *testing.T, text string) []sample {
	t.Helper()
	var out []sample
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var s sample
		rest := line
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			require.Greater(t, j, i, line)
			s.name, s.labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else {
			s.name, rest, _ = strings.Cut(line, " ")
		}
		f := strings.Fields(rest)
		require.NotEmpty(t, f, line)
		v, err := strconv.ParseFloat(f[0], 64)
		require.NoError(t, err, line)
		s.value = v
		if len(f) > 1 {
			ms, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err, line)
			s.time = time.UnixMilli(ms)
		}
		out = append(out, s)
	}
	return out
}
