package stats

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/cri"
)

var update = flag.Bool("update", false, "rewrite testdata/ golden files")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRuntime answers from its fields; errs fails a method by name.
type fakeRuntime struct {
	mu         sync.Mutex
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
	cstats     []*runtimeapi.ContainerStats
	sbStats    []*runtimeapi.PodSandboxStats
	imageFs    *runtimeapi.ImageFsInfoResponse
	errs       map[string]error
}

func (f *fakeRuntime) err(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs[method]
}

func (f *fakeRuntime) ListPodSandbox(context.Context, *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	return f.sandboxes, f.err("ListPodSandbox")
}

func (f *fakeRuntime) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return f.containers, f.err("ListContainers")
}

func (f *fakeRuntime) ListContainerStats(context.Context, *runtimeapi.ContainerStatsFilter) ([]*runtimeapi.ContainerStats, error) {
	return f.cstats, f.err("ListContainerStats")
}

func (f *fakeRuntime) ListPodSandboxStats(context.Context, *runtimeapi.PodSandboxStatsFilter) ([]*runtimeapi.PodSandboxStats, error) {
	return f.sbStats, f.err("ListPodSandboxStats")
}

func (f *fakeRuntime) ImageFsInfo(context.Context) (*runtimeapi.ImageFsInfoResponse, error) {
	return f.imageFs, f.err("ImageFsInfo")
}

var t0 = time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)

func u64(v uint64) *runtimeapi.UInt64Value { return &runtimeapi.UInt64Value{Value: v} }

func sandbox(id, name, uid string, state runtimeapi.PodSandboxState, created time.Time) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id: id, State: state, CreatedAt: created.UnixNano(),
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: uid},
		Labels:   map[string]string{cri.LabelPodName: name, cri.LabelPodNamespace: "default", cri.LabelPodUID: uid},
	}
}

func container(id, sandboxID, name string, state runtimeapi.ContainerState, created time.Time) *runtimeapi.Container {
	return &runtimeapi.Container{
		Id: id, PodSandboxId: sandboxID, State: state, CreatedAt: created.UnixNano(),
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Labels:   map[string]string{cri.LabelContainerName: name},
	}
}

func containerStats(id string, at time.Time, cpuNs, workingSet uint64) *runtimeapi.ContainerStats {
	return &runtimeapi.ContainerStats{
		Attributes: &runtimeapi.ContainerAttributes{Id: id},
		Cpu:        &runtimeapi.CpuUsage{Timestamp: at.UnixNano(), UsageCoreNanoSeconds: u64(cpuNs)},
		Memory: &runtimeapi.MemoryUsage{Timestamp: at.UnixNano(), WorkingSetBytes: u64(workingSet),
			UsageBytes: u64(workingSet + 4096), RssBytes: u64(workingSet / 2), PageFaults: u64(100), MajorPageFaults: u64(1)},
		WritableLayer: &runtimeapi.FilesystemUsage{Timestamp: at.UnixNano(),
			FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/containerd/overlayfs"}, UsedBytes: u64(8192), InodesUsed: u64(3)},
	}
}

// testHost writes /proc and /sys/fs/cgroup fixtures of a cgroup v1 node (v2 when
// unified) under a temporary folder.
type testHost struct {
	dir     string
	unified bool
}

func newTestHost(t *testing.T, unified bool) *testHost {
	h := &testHost{dir: t.TempDir(), unified: unified}
	h.write(t, "proc/stat", "cpu  100 0 50 1000 0 0 0 0 0 0\ncpu0 100 0 50 1000 0 0 0 0 0 0\nbtime 1796270000\n")
	h.write(t, "proc/meminfo", "MemTotal:        8192000 kB\nMemFree:         2048000 kB\nSwapTotal:       1024000 kB\nSwapFree:         768000 kB\n")
	h.write(t, "proc/sys/kernel/pid_max", "4194304\n")
	h.write(t, "proc/net/dev", `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  500       5    0    0    0     0          0         0      500       5    0    0    0     0       0          0
  eth0: 1000      10    1    0    0     0          0         0     2000      20    2    0    0     0       0          0
vethab12: 300     3    0    0    0     0          0         0      300       3    0    0    0     0       0          0
  eth1:  10       1    0    0    0     0          0         0       20       2    0    0    0     0       0          0
`)
	if unified {
		h.write(t, "cgroup/cgroup.controllers", "cpu memory pids\n")
		h.setCPU(t, 5*time.Second)
		h.write(t, "cgroup/memory.stat", "anon 1048576000\nfile 2000000000\ninactive_file 1000000000\npgfault 5000\npgmajfault 7\n")
	} else {
		h.setCPU(t, 5*time.Second)
		h.write(t, "cgroup/memory/memory.usage_in_bytes", "4000000000\n")
		h.write(t, "cgroup/memory/memory.stat", "cache 1\nrss 2\ntotal_rss 1500000000\ntotal_inactive_file 1000000000\ntotal_pgfault 6000\ntotal_pgmajfault 8\n")
	}
	return h
}

func (h *testHost) write(t *testing.T, name, content string) {
	t.Helper()
	path := filepath.Join(h.dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

func (h *testHost) setCPU(t *testing.T, d time.Duration) {
	if h.unified {
		h.write(t, "cgroup/cpu.stat", "usage_usec "+itoa(uint64(d/time.Microsecond))+"\nuser_usec 1\nsystem_usec 1\n")
		return
	}
	h.write(t, "cgroup/cpuacct/cpuacct.usage", itoa(uint64(d))+"\n")
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

func (h *testHost) host() host {
	return host{
		procDir:   filepath.Join(h.dir, "proc"),
		cgroupDir: filepath.Join(h.dir, "cgroup"),
		statfs: func(path string) (fsInfo, error) {
			if path == "/missing" {
				return fsInfo{}, errors.New("statfs /missing: no such file or directory")
			}
			return fsInfo{capacity: 100 << 30, available: 60 << 30, used: 40 << 30, inodes: 1000000, inodesFree: 900000}, nil
		},
		procCount: func() (uint64, error) { return 321, nil },
		// Block counts depend on the file system; the real dirUsage has its own test.
		dirUsage: func(dir string) (uint64, uint64, error) {
			_, files, err := dirUsage(dir)
			return files * 12288, files, err
		},
	}
}

type fixture struct {
	rt    *fakeRuntime
	host  *testHost
	clock *testingclock.FakeClock
	p     *Provider
	logs  string
}

// newFixture has two pods: "web" (containers app and sidecar, an exited earlier
// app, and an older NotReady sandbox of the same pod) and "db" (one container).
func newFixture(t *testing.T, unified bool) *fixture {
	logs := t.TempDir()
	rt := &fakeRuntime{
		sandboxes: []*runtimeapi.PodSandbox{
			sandbox("sb-web-old", "web", "uid-web", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, t0.Add(-2*time.Hour)),
			sandbox("sb-web", "web", "uid-web", runtimeapi.PodSandboxState_SANDBOX_READY, t0.Add(-time.Hour)),
			sandbox("sb-db", "db", "uid-db", runtimeapi.PodSandboxState_SANDBOX_READY, t0.Add(-30*time.Minute)),
		},
		containers: []*runtimeapi.Container{
			container("c-web-old", "sb-web-old", "app", runtimeapi.ContainerState_CONTAINER_EXITED, t0.Add(-2*time.Hour)),
			container("c-app-0", "sb-web", "app", runtimeapi.ContainerState_CONTAINER_EXITED, t0.Add(-59*time.Minute)),
			container("c-app", "sb-web", "app", runtimeapi.ContainerState_CONTAINER_RUNNING, t0.Add(-50*time.Minute)),
			container("c-sidecar", "sb-web", "sidecar", runtimeapi.ContainerState_CONTAINER_RUNNING, t0.Add(-58*time.Minute)),
			container("c-db", "sb-db", "db", runtimeapi.ContainerState_CONTAINER_RUNNING, t0.Add(-29*time.Minute)),
		},
		imageFs: &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{{
			Timestamp: t0.UnixNano(), FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/containerd/overlayfs"},
			UsedBytes: u64(300 << 20), InodesUsed: u64(4000),
		}}},
		errs: map[string]error{"ListPodSandboxStats": status.Error(codes.Unimplemented, "unknown method ListPodSandboxStats")},
	}
	rt.setStats(t0, 0)
	h := newTestHost(t, unified)
	clk := testingclock.NewFakeClock(t0)
	p, err := New(Config{Runtime: rt, NodeName: "node-1", RootDir: "/var/lib/kubelet", PodLogsDir: logs, Clock: clk})
	require.NoError(t, err)
	p.host = h.host()
	// A log file for web/app.
	dir := filepath.Join(logs, "default_web_uid-web", "app")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "0.log"), make([]byte, 10<<10), 0o644))
	// A pod-level file (the kubelet keeps none today, but counts them).
	require.NoError(t, os.WriteFile(filepath.Join(logs, "default_web_uid-web", "pod.log"), nil, 0o644))
	// An empty folder for web/sidecar; none for db.
	require.NoError(t, os.MkdirAll(filepath.Join(logs, "default_web_uid-web", "sidecar"), 0o755))
	return &fixture{rt: rt, host: h, clock: clk, p: p, logs: logs}
}

// setStats gives every running container stats at at, with CPU grown by extra.
func (f *fakeRuntime) setStats(at time.Time, extra time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cstats = []*runtimeapi.ContainerStats{
		containerStats("c-app", at, uint64(2*time.Second+extra), 100<<20),
		containerStats("c-sidecar", at, uint64(time.Second+extra/2), 20<<20),
		containerStats("c-db", at, uint64(30*time.Second+extra/4), 500<<20),
		containerStats("c-app-0", at, 1, 1),
	}
}

// advance moves the clock by 10 s, with 5 s more node CPU and, for the
// containers, 1 s (app), 0.5 s (sidecar) and 0.25 s (db).
func (fx *fixture) advance(t *testing.T) {
	fx.clock.Step(10 * time.Second)
	fx.host.setCPU(t, 10*time.Second)
	fx.rt.setStats(fx.clock.Now(), time.Second)
}

func get(t *testing.T, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), method, target, nil))
	return rec
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -update to create %s", path)
	assert.Equal(t, string(want), string(got), "golden %s (go test -update rewrites it)", path)
}

func TestSummaryGolden(t *testing.T) {
	for _, unified := range []bool{false, true} {
		name := map[bool]string{false: "cgroup-v1", true: "cgroup-v2"}[unified]
		t.Run(name, func(t *testing.T) {
			fx := newFixture(t, unified)
			h := fx.p.SummaryHandler()
			require.Equal(t, http.StatusOK, get(t, h, http.MethodGet, "/stats/summary").Code)
			fx.advance(t)
			rec := get(t, h, http.MethodGet, "/stats/summary")
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			golden(t, "summary-"+name+".json", rec.Body.Bytes())

			var s statsapi.Summary
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
			// 5 s of node CPU over 10 s is half a core.
			assert.Equal(t, uint64(500_000_000), *s.Node.CPU.UsageNanoCores)
			require.Len(t, s.Pods, 2)
			web := s.Pods[1]
			assert.Equal(t, statsapi.PodReference{Name: "web", Namespace: "default", UID: "uid-web"}, web.PodRef)
			require.Len(t, web.Containers, 2, "the exited app and the old sandbox are left out")
			assert.Equal(t, uint64(100_000_000), *web.Containers[0].CPU.UsageNanoCores)
			assert.Equal(t, uint64(150_000_000), *web.CPU.UsageNanoCores, "pod = app + sidecar")
			assert.Equal(t, uint64(120<<20), *web.Memory.WorkingSetBytes)
			assert.Equal(t, uint64(12288), *web.Containers[0].Logs.UsedBytes)
			require.NotNil(t, web.Containers[1].Logs)
			assert.Nil(t, web.Containers[1].Logs.UsedBytes, "no log files yet")
			assert.Equal(t, uint64(100<<30), *web.Containers[1].Logs.CapacityBytes)
			assert.Nil(t, s.Pods[0].Containers[0].Logs, "no log folder")
			assert.Equal(t, uint64(12288+12288+8192+8192), *web.EphemeralStorage.UsedBytes, "pod and container logs, two writable layers")
		})
	}
}

func TestNodeMemoryWorkingSet(t *testing.T) {
	for _, tc := range []struct {
		unified                bool
		usage, workingSet, rss uint64
	}{
		// v1: memory.usage_in_bytes - total_inactive_file.
		{unified: false, usage: 4000000000, workingSet: 3000000000, rss: 1500000000},
		// v2: MemTotal - MemFree from meminfo, minus inactive_file.
		{unified: true, usage: (8192000 - 2048000) * 1024, workingSet: (8192000-2048000)*1024 - 1000000000, rss: 1048576000},
	} {
		h := newTestHost(t, tc.unified).host()
		m, err := h.memory()
		require.NoError(t, err)
		assert.Equal(t, tc.usage, m.usage, "unified=%v", tc.unified)
		assert.Equal(t, tc.workingSet, m.workingSet, "unified=%v", tc.unified)
		assert.Equal(t, tc.rss, m.rss, "unified=%v", tc.unified)
		assert.Equal(t, uint64(8192000*1024), m.capacity)
	}
}

func TestNodeCPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove string
		want   time.Duration
	}{
		{"v1 cpuacct.usage", "", 5 * time.Second},
		{"v1 without cpuacct: /proc/stat", "cgroup/cpuacct/cpuacct.usage", 1500 * time.Millisecond},
		{"v2 cpu.stat", "", 5 * time.Second},
		{"v2 without cpu.stat: /proc/stat", "cgroup/cpu.stat", 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := newTestHost(t, strings.HasPrefix(tc.name, "v2"))
			if tc.remove != "" {
				require.NoError(t, os.Remove(filepath.Join(th.dir, tc.remove)))
			}
			got, err := th.host().cpuUsage()
			require.NoError(t, err)
			// /proc/stat: user 100 + system 50 ticks of 10 ms.
			assert.Equal(t, uint64(tc.want), got)
		})
	}
}

func TestSandboxStats(t *testing.T) {
	fx := newFixture(t, false)
	fx.rt.errs = nil
	fx.rt.sbStats = []*runtimeapi.PodSandboxStats{
		{Attributes: &runtimeapi.PodSandboxAttributes{Id: "sb-web"}, Linux: &runtimeapi.LinuxPodSandboxStats{
			Cpu:    &runtimeapi.CpuUsage{Timestamp: t0.UnixNano(), UsageCoreNanoSeconds: u64(uint64(7 * time.Second)), UsageNanoCores: u64(42)},
			Memory: &runtimeapi.MemoryUsage{Timestamp: t0.UnixNano(), WorkingSetBytes: u64(200 << 20)},
			Network: &runtimeapi.NetworkUsage{Timestamp: t0.UnixNano(),
				DefaultInterface: &runtimeapi.NetworkInterfaceUsage{Name: "eth0", RxBytes: u64(10), TxBytes: u64(20)},
				Interfaces:       []*runtimeapi.NetworkInterfaceUsage{{Name: "eth0", RxBytes: u64(10), TxBytes: u64(20)}}},
			Process: &runtimeapi.ProcessUsage{Timestamp: t0.UnixNano(), ProcessCount: u64(4)},
		}},
		// A sandbox the listing left out (the old one) is not reported.
		{Attributes: &runtimeapi.PodSandboxAttributes{Id: "sb-web-old"}, Linux: &runtimeapi.LinuxPodSandboxStats{}},
		// No Linux stats: summed from the containers.
		{Attributes: &runtimeapi.PodSandboxAttributes{Id: "sb-db"}},
	}
	s, err := fx.p.Summary(context.Background())
	require.NoError(t, err)
	require.Len(t, s.Pods, 2)
	db, web := s.Pods[0], s.Pods[1]
	assert.Equal(t, uint64(7*time.Second), *web.CPU.UsageCoreNanoSeconds)
	assert.Equal(t, uint64(42), *web.CPU.UsageNanoCores)
	assert.Equal(t, uint64(200<<20), *web.Memory.WorkingSetBytes)
	require.NotNil(t, web.Network)
	assert.Equal(t, "eth0", web.Network.Name)
	assert.Equal(t, uint64(20), *web.Network.TxBytes)
	assert.Equal(t, uint64(4), *web.ProcessStats.ProcessCount)
	assert.Equal(t, uint64(30*time.Second), *db.CPU.UsageCoreNanoSeconds)
	assert.Equal(t, uint64(500<<20), *db.Memory.WorkingSetBytes)
}

func TestSummaryQuery(t *testing.T) {
	fx := newFixture(t, false)
	h := fx.p.SummaryHandler()
	for _, tc := range []struct {
		target  string
		trimmed bool
	}{
		{"/stats/summary?only_cpu_and_memory=true", true},
		{"/stats/summary?only_cpu_and_memory=false", false},
		{"/stats/summary?only_cpu_and_memory=1", false},
		{"/stats/summary?only_cpu_and_memory=true&only_cpu_and_memory=true", false},
		{"/stats/summary", false},
	} {
		rec := get(t, h, http.MethodGet, tc.target)
		require.Equal(t, http.StatusOK, rec.Code, tc.target)
		var s statsapi.Summary
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
		assert.Equal(t, tc.trimmed, s.Node.Fs == nil, tc.target)
		assert.Equal(t, tc.trimmed, s.Node.Runtime == nil, tc.target)
		assert.Equal(t, tc.trimmed, s.Pods[0].Containers[0].Rootfs == nil, tc.target)
		assert.NotNil(t, s.Pods[0].Containers[0].CPU, tc.target)
		assert.NotNil(t, s.Node.Memory.WorkingSetBytes, tc.target)
	}
	golden(t, "summary-cpu-and-memory.json", get(t, h, http.MethodGet, "/stats/summary?only_cpu_and_memory=true").Body.Bytes())
	assert.Equal(t, http.StatusOK, get(t, h, http.MethodPost, "/stats/summary").Code, "the kubelet takes POST too")
	rec := get(t, h, http.MethodPut, "/stats/summary")
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

func TestSummaryErrors(t *testing.T) {
	for _, tc := range []struct {
		method, want string
	}{
		{"ListPodSandbox", "Internal Error: list pod sandboxes: boom"},
		{"ListContainers", "Internal Error: list containers: boom"},
		{"ListContainerStats", "Internal Error: list container stats: boom"},
		{"ImageFsInfo", "Internal Error: runtime image fs: boom"},
	} {
		t.Run(tc.method, func(t *testing.T) {
			fx := newFixture(t, false)
			fx.rt.errs[tc.method] = errors.New("boom")
			rec := get(t, fx.p.SummaryHandler(), http.MethodGet, "/stats/summary")
			assert.Equal(t, http.StatusInternalServerError, rec.Code)
			assert.Equal(t, tc.want, rec.Body.String())
		})
	}
	t.Run("ListPodSandboxStats falls back", func(t *testing.T) {
		fx := newFixture(t, false)
		fx.rt.errs["ListPodSandboxStats"] = status.Error(codes.Unknown, "cgroupPath is empty")
		s, err := fx.p.Summary(context.Background())
		require.NoError(t, err)
		assert.Equal(t, uint64(3*time.Second), *s.Pods[1].CPU.UsageCoreNanoSeconds)
	})
	t.Run("cgroup missing", func(t *testing.T) {
		fx := newFixture(t, false)
		require.NoError(t, os.Remove(filepath.Join(fx.host.dir, "cgroup/memory/memory.usage_in_bytes")))
		rec := get(t, fx.p.SummaryHandler(), http.MethodGet, "/stats/summary")
		assert.Equal(t, http.StatusInternalServerError, rec.Code)
		assert.Contains(t, rec.Body.String(), "Internal Error: node node-1 stats: open ")
		assert.Contains(t, rec.Body.String(), "memory.usage_in_bytes")
	})
	t.Run("root dir statfs", func(t *testing.T) {
		fx := newFixture(t, false)
		fx.p.cfg.RootDir = "/missing"
		rec := get(t, fx.p.SummaryHandler(), http.MethodGet, "/stats/summary")
		assert.Equal(t, http.StatusInternalServerError, rec.Code)
		assert.Equal(t, "Internal Error: node node-1 stats: statfs /missing: no such file or directory", rec.Body.String())
	})
}

func TestResourceMetricsGolden(t *testing.T) {
	fx := newFixture(t, false)
	// Swap figures for one container, to show the swap series.
	fx.rt.cstats[0].Swap = &runtimeapi.SwapUsage{Timestamp: t0.UnixNano(), SwapUsageBytes: u64(4096), SwapAvailableBytes: u64(1 << 20)}
	rec := get(t, fx.p.ResourceMetricsHandler(), http.MethodGet, "/metrics/resource")
	require.Equal(t, http.StatusOK, rec.Code)
	golden(t, "metrics-resource.txt", rec.Body.Bytes())
	assert.NotContains(t, rec.Body.String(), "scrape_error{", "hidden in 1.37")
	assert.NotContains(t, rec.Body.String(), "\nscrape_error ")
}

func TestResourceMetricsError(t *testing.T) {
	fx := newFixture(t, false)
	fx.rt.errs["ListContainerStats"] = errors.New("boom")
	rec := get(t, fx.p.ResourceMetricsHandler(), http.MethodGet, "/metrics/resource")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, `# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 1
`, rec.Body.String())
}

func TestNew(t *testing.T) {
	rt := &fakeRuntime{}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no runtime", Config{NodeName: "n"}, "invalid stats config: Runtime is required"},
		{"no node name", Config{Runtime: rt}, "invalid stats config: NodeName is required"},
		{"relative root", Config{Runtime: rt, NodeName: "n", RootDir: "var/lib/kubelet"}, `invalid stats config: RootDir "var/lib/kubelet" is not absolute`},
		{"relative logs", Config{Runtime: rt, NodeName: "n", PodLogsDir: "logs"}, `invalid stats config: PodLogsDir "logs" is not absolute`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.EqualError(t, err, tc.want)
		})
	}
	p, err := New(Config{Runtime: rt, NodeName: "n"})
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/kubelet", p.cfg.RootDir)
	assert.Equal(t, "/var/log/pods", p.cfg.PodLogsDir)
	assert.NotNil(t, p.cfg.Clock)
}

func TestCPUCacheForgetsRemovedContainers(t *testing.T) {
	fx := newFixture(t, false)
	_, err := fx.p.Summary(context.Background())
	require.NoError(t, err)
	assert.Len(t, fx.p.cpuCache, 3)
	fx.rt.containers = fx.rt.containers[:3] // sidecar and db are gone
	_, err = fx.p.Summary(context.Background())
	require.NoError(t, err)
	assert.Len(t, fx.p.cpuCache, 1)
}

func TestDirUsage(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "c", "sub"), 0o755))
	data := make([]byte, 10<<10)
	for i := range data {
		data[i] = 'x'
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c", "0.log"), data, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c", "1.log"), data, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c", "sub", "x.log"), data, 0o644))
	used, files, err := dirUsage(filepath.Join(dir, "c"))
	require.NoError(t, err)
	assert.Equal(t, uint64(2), files, "the two files, not the sub-folder")
	assert.GreaterOrEqual(t, used, uint64(20<<10))
	assert.Less(t, used, uint64(30<<10))
	_, _, err = dirUsage(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestSwapWithoutNodeSwap(t *testing.T) {
	fx := newFixture(t, false)
	fx.host.write(t, "proc/meminfo", "MemTotal:        8192000 kB\nMemFree:         2048000 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n")
	s, err := fx.p.CPUAndMemory(context.Background())
	require.NoError(t, err)
	for _, pod := range s.Pods {
		require.NotNil(t, pod.Swap, pod.PodRef.Name)
		assert.Equal(t, uint64(0), *pod.Swap.SwapUsageBytes)
		for _, c := range pod.Containers {
			require.NotNil(t, c.Swap, c.Name)
			assert.Equal(t, uint64(0), *c.Swap.SwapUsageBytes)
			assert.Nil(t, c.Swap.SwapAvailableBytes, "no limit is known")
		}
	}
	text := get(t, fx.p.ResourceMetricsHandler(), http.MethodGet, "/metrics/resource").Body.String()
	assert.Contains(t, text, `container_swap_usage_bytes{container="db",namespace="default",pod="db"} 0 1796284800000`)
	assert.Contains(t, text, `pod_swap_usage_bytes{namespace="default",pod="web"} 0 1796284800000`)
	assert.Contains(t, text, "node_swap_usage_bytes 0 1796284800000")
	assert.NotContains(t, text, "container_swap_limit_bytes{")
}

// TestConcurrentScrapes runs summaries and metrics scrapes side by side (go test
// -race checks the CPU cache and the collector's context hand-over).
func TestConcurrentScrapes(t *testing.T) {
	fx := newFixture(t, false)
	sh, mh := fx.p.SummaryHandler(), fx.p.ResourceMetricsHandler()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 10 {
				if i%2 == 0 {
					assert.Equal(t, http.StatusOK, get(t, sh, http.MethodGet, "/stats/summary").Code)
				} else {
					assert.Contains(t, get(t, mh, http.MethodGet, "/metrics/resource").Body.String(), "\nresource_scrape_error 0\n")
				}
			}
		})
	}
	wg.Wait()
}
