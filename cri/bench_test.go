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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
)

// BenchmarkCallOverhead compares a Version call through the Client with the same call
// on a bare generated gRPC client over the same containerd socket. Goal: under 5%.
// The variants alternate call by call, so load from other processes hits them alike.
// overhead-% is (client - bare) / bare; overhead-vs-deadline-% compares with a bare call
// that carries the same per-call deadline (gRPC then sends grpc-timeout and the server
// arms a timer: a cost of having timeouts at all, not of this package).
func BenchmarkCallOverhead(b *testing.B) {
	testenv.RequireRoot(b)
	rt := containerd.Start(b, containerd.Options{})
	benchOverhead(b, rt.Endpoint())
}

// BenchmarkCallOverheadFake is BenchmarkCallOverhead against the in-process fake, where
// the runtime's own work is near zero and the client's share is largest.
func BenchmarkCallOverheadFake(b *testing.B) {
	dir, err := os.MkdirTemp("", "nkbench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := fakeruntime.New().Serve(filepath.Join(dir, "cri.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	benchOverhead(b, srv.Endpoint())
}

func benchOverhead(b *testing.B, endpoint string) {
	ctx := context.Background()
	path, err := cri.ParseEndpoint(endpoint)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cri.MaxMessageSize)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	bare := runtimeapi.NewRuntimeServiceClient(conn)
	if _, err := bare.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		b.Fatal(err)
	}
	c, err := cri.New(ctx, cri.Config{Endpoint: endpoint})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	callBare := func() time.Duration {
		start := time.Now()
		if _, err := bare.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	callBareDeadline := func() time.Duration {
		start := time.Now()
		dctx, cancel := context.WithTimeout(ctx, cri.DefaultCallTimeout)
		_, err := bare.Version(dctx, &runtimeapi.VersionRequest{})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	callClient := func() time.Duration {
		start := time.Now()
		if _, err := c.Version(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var bareTotal, deadlineTotal, clientTotal time.Duration
	i := 0
	b.ResetTimer()
	for b.Loop() {
		// Alternate which goes first, so neither always pays for a cold cache.
		if i%2 == 0 {
			bareTotal += callBare()
			deadlineTotal += callBareDeadline()
			clientTotal += callClient()
		} else {
			clientTotal += callClient()
			deadlineTotal += callBareDeadline()
			bareTotal += callBare()
		}
		i++
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(bareTotal.Microseconds())/n, "us/bare-call")
	b.ReportMetric(float64(clientTotal.Microseconds())/n, "us/client-call")
	b.ReportMetric(float64(deadlineTotal.Microseconds())/n, "us/bare-deadline-call")
	b.ReportMetric(100*(float64(clientTotal)-float64(bareTotal))/float64(bareTotal), "overhead-%")
	// The client's own cost, beyond what a per-call deadline costs any gRPC client.
	b.ReportMetric(100*(float64(clientTotal)-float64(deadlineTotal))/float64(deadlineTotal), "overhead-vs-deadline-%")
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
