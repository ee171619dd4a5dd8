package cri_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
)

// BenchmarkCallOverhead measures what the Client adds to a CRI call, against a real
// containerd and against the in-process fake, on the calls of the kubelet's hot path:
// Version, ListPodSandbox and ListContainers over a small node (10 pods, 30
// containers), ContainerStatus, and ExecSync (fake only: a real exec takes 100+ ms).
//
// Each iteration makes the same call three ways, in an order that cycles through all
// six permutations so that load from other processes and position effects hit them
// alike: on the bare generated gRPC client over the Client's own connection ("bare"),
// the same with the per-call deadline the Client sets ("bare-deadline"), and through
// the Client ("nodekit"). The figures are per-variant medians. overhead-% is
// (nodekit - bare) / bare; overhead-vs-deadline-% compares with bare-deadline, leaving
// out what any gRPC call pays for carrying a deadline (the grpc-timeout header, the
// server's timers). Run with -count 6 or more and feed the output to benchstat.
func BenchmarkCallOverhead(b *testing.B) {
	b.Run("containerd", func(b *testing.B) {
		testenv.RequireRoot(b)
		rt := containerd.Start(b, containerd.Options{})
		c, err := cri.New(context.Background(), cri.Config{Endpoint: rt.Endpoint()})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		containerID := populate(b, c, rt.BusyboxImage())
		benchCalls(b, c, containerID, false)
	})
	b.Run("fake", func(b *testing.B) {
		dir, err := os.MkdirTemp("", "nkbench-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		fake := fakeruntime.New()
		const image = "registry.k8s.io/busybox:1.35"
		fake.AddImage(image)
		srv, err := fake.Serve(filepath.Join(dir, "cri.sock"))
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Stop()
		c, err := cri.New(context.Background(), cri.Config{Endpoint: srv.Endpoint()})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		containerID := populate(b, c, image)
		// The fake records every call; start each measurement from an empty record.
		fake.ResetCalls()
		benchCalls(b, c, containerID, true)
	})
}

// Shape of the node the List calls see.
const (
	benchPods             = 10
	benchContainersPerPod = 3
)

// populate runs benchPods host-network sandboxes (no CNI needed) with
// benchContainersPerPod containers each, the first started and the others created,
// and returns a started container's ID.
func populate(b *testing.B, c *cri.Client, image string) string {
	b.Helper()
	ctx := context.Background()
	logsDir := b.TempDir()
	var started string
	for i := range benchPods {
		pod := busyboxPod(fmt.Sprintf("bench-%d", i), image)
		pod.Spec.HostNetwork = true
		pod.Spec.Containers = nil
		for j := range benchContainersPerPod {
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
				Name: fmt.Sprintf("c%d", j), Image: image, Command: []string{"sleep", "3600"},
			})
		}
		sb, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: logsDir})
		if err != nil {
			b.Fatal(err)
		}
		sandboxID, err := c.RunPodSandbox(ctx, sb, "")
		if err != nil {
			b.Fatal(err)
		}
		for j, ctr := range pod.Spec.Containers {
			cfg, err := cri.ContainerConfig(pod, ctr.Name, 0, image)
			if err != nil {
				b.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(sb.LogDirectory, ctr.Name), 0o755); err != nil {
				b.Fatal(err)
			}
			id, err := c.CreateContainer(ctx, sandboxID, cfg, sb)
			if err != nil {
				b.Fatal(err)
			}
			if j == 0 {
				if err := c.StartContainer(ctx, id); err != nil {
					b.Fatal(err)
				}
				started = id
			}
		}
	}
	return started
}

// benchCall is one CRI call made the bare way (on rt, under ctx) and through the Client.
type benchCall struct {
	name    string
	bare    func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error
	nodekit func(ctx context.Context, c *cri.Client) error
}

func benchCalls(b *testing.B, c *cri.Client, containerID string, withExec bool) {
	// The bare client runs on the Client's own connection: two connections to the same
	// server differ by up to 10% per call here (measured), more than the Client's cost.
	bare := c.RuntimeService()

	calls := []benchCall{
		{
			name: "Version",
			bare: func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
				_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
				return err
			},
			nodekit: func(ctx context.Context, c *cri.Client) error {
				_, err := c.Version(ctx)
				return err
			},
		},
		{
			name: "ListPodSandbox",
			bare: func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
				resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
				return checkCount(err, len(resp.GetItems()), benchPods)
			},
			nodekit: func(ctx context.Context, c *cri.Client) error {
				items, err := c.ListPodSandbox(ctx, nil)
				return checkCount(err, len(items), benchPods)
			},
		},
		{
			name: "ListContainers",
			bare: func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
				resp, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
				return checkCount(err, len(resp.GetContainers()), benchPods*benchContainersPerPod)
			},
			nodekit: func(ctx context.Context, c *cri.Client) error {
				items, err := c.ListContainers(ctx, nil)
				return checkCount(err, len(items), benchPods*benchContainersPerPod)
			},
		},
		{
			name: "ContainerStatus",
			bare: func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
				_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: containerID})
				return err
			},
			nodekit: func(ctx context.Context, c *cri.Client) error {
				_, err := c.ContainerStatus(ctx, containerID)
				return err
			},
		},
	}
	if withExec {
		// The Client's ExecSync deadline is the command's timeout plus CallTimeout.
		const execTimeout = time.Second
		calls = append(calls, benchCall{
			name: "ExecSync",
			bare: func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
				_, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: []string{"true"}, Timeout: 1})
				return err
			},
			nodekit: func(ctx context.Context, c *cri.Client) error {
				_, _, _, err := c.ExecSync(ctx, containerID, []string{"true"}, execTimeout)
				return err
			},
		})
	}
	for _, call := range calls {
		b.Run(call.name, func(b *testing.B) { benchOverhead(b, bare, c, call) })
	}
}

func checkCount(err error, got, want int) error {
	if err == nil && got != want {
		return fmt.Errorf("got %d items, want %d", got, want)
	}
	return err
}

// benchOrders are the six orders of the three variants, cycled through.
var benchOrders = [6][3]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {2, 1, 0}, {1, 0, 2}}

func benchOverhead(b *testing.B, bare runtimeapi.RuntimeServiceClient, c *cri.Client, call benchCall) {
	ctx := context.Background()
	variants := [3]func() error{
		func() error { return call.bare(ctx, bare) },
		func() error {
			dctx, cancel := context.WithTimeout(ctx, cri.DefaultCallTimeout)
			defer cancel()
			return call.bare(dctx, bare)
		},
		func() error { return call.nodekit(ctx, c) },
	}
	// Warm both connections and check the calls work before timing them.
	for _, v := range variants {
		if err := v(); err != nil {
			b.Fatal(err)
		}
	}
	// Medians, not sums: one preemption by another process lands on one variant and
	// would outweigh thousands of calls in a sum.
	var samples [3][]time.Duration
	for v := range samples {
		samples[v] = make([]time.Duration, 0, b.N)
	}
	i := 0
	for b.Loop() {
		for _, v := range benchOrders[i%len(benchOrders)] {
			start := time.Now()
			err := variants[v]()
			samples[v] = append(samples[v], time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
		}
		i++
	}
	bareT, deadlineT, clientT := median(samples[0]), median(samples[1]), median(samples[2])
	b.ReportMetric(bareT*1e3, "us/bare")
	b.ReportMetric(deadlineT*1e3, "us/bare-deadline")
	b.ReportMetric(clientT*1e3, "us/nodekit")
	b.ReportMetric(100*(clientT-bareT)/bareT, "overhead-%")
	b.ReportMetric(100*(clientT-deadlineT)/deadlineT, "overhead-vs-deadline-%")
	// ns/op covers all three calls; it says nothing on its own.
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPodStart measures RunPodSandbox + CreateContainer + StartContainer for one
// busybox pod with CNI, through the Client and through crictl (runp, create, start:
// three processes, as a person or a script would do it), and reports the median.
// Run with -benchtime=20x for the "median over 20 pods".
func BenchmarkPodStart(b *testing.B) {
	testenv.RequireRoot(b)
	rt := containerd.Start(b, containerd.Options{CNI: true})
	ctx := context.Background()
	c, err := cri.New(ctx, cri.Config{Endpoint: rt.Endpoint()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	logsDir := b.TempDir()
	seq := 0
	configs := func(prefix string) (*runtimeapi.PodSandboxConfig, *runtimeapi.ContainerConfig) {
		seq++
		pod := busyboxPod(fmt.Sprintf("%s-%d", prefix, seq), rt.BusyboxImage(), "sleep", "3600")
		sb, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: logsDir})
		if err != nil {
			b.Fatal(err)
		}
		ctr, err := cri.ContainerConfig(pod, "main", 0, rt.BusyboxImage())
		if err != nil {
			b.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(sb.LogDirectory, "main"), 0o755); err != nil {
			b.Fatal(err)
		}
		return sb, ctr
	}
	var sandboxes []string
	cleanup := func() {
		for _, id := range sandboxes {
			_ = c.StopPodSandbox(ctx, id)
			_ = c.RemovePodSandbox(ctx, id)
		}
		sandboxes = nil
	}

	b.Run("nodekit", func(b *testing.B) {
		var durations []time.Duration
		for b.Loop() {
			b.StopTimer()
			sb, ctr := configs("nk")
			b.StartTimer()
			start := time.Now()
			id, err := c.RunPodSandbox(ctx, sb, "")
			if err != nil {
				b.Fatal(err)
			}
			cid, err := c.CreateContainer(ctx, id, ctr, sb)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.StartContainer(ctx, cid); err != nil {
				b.Fatal(err)
			}
			durations = append(durations, time.Since(start))
			sandboxes = append(sandboxes, id)
		}
		b.StopTimer()
		b.ReportMetric(median(durations), "ms/pod-median")
		cleanup()
	})

	b.Run("crictl", func(b *testing.B) {
		crictl := containerd.Crictl(b)
		dir := b.TempDir()
		run := func(args ...string) string {
			out, err := exec.Command(crictl, rt.CrictlArgs(args...)...).Output()
			if err != nil {
				b.Fatalf("crictl %v: %v %s", args, err, out)
			}
			return strings.TrimSpace(string(out))
		}
		var durations []time.Duration
		for b.Loop() {
			b.StopTimer()
			sb, ctr := configs("crictl")
			sbPath, ctrPath := filepath.Join(dir, "pod.json"), filepath.Join(dir, "ctr.json")
			writeJSON(b, sbPath, sb)
			writeJSON(b, ctrPath, ctr)
			b.StartTimer()
			start := time.Now()
			id := run("runp", sbPath)
			cid := run("create", id, ctrPath, sbPath)
			run("start", cid)
			durations = append(durations, time.Since(start))
			sandboxes = append(sandboxes, id)
		}
		b.StopTimer()
		b.ReportMetric(median(durations), "ms/pod-median")
		cleanup()
	})
}

func writeJSON(b *testing.B, path string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
