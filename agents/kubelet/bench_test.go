package main_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// BenchmarkPodStart measures pod start latency, image present, in one run:
// "containerd" is the runtime's own RunPodSandbox + CreateContainer +
// StartContainer for the same pod (the floor), "kubelet" is API create to the
// pod's Ready condition through nodekit's kubelet. The direct pods run on a
// containerd of their own: the kubelet's relist would remove them as orphans while
// the next ones start. Each iteration starts `pods` pods at once; p50 and p99 are
// over every pod started. TestPodStartBench runs the upstream kubelet beside it.
func BenchmarkPodStart(b *testing.B) {
	testenv.RequireLong(b)
	testenv.RequireRoot(b)
	cp := controlplane.Start(b, controlplane.Options{})
	n := startNode(b, cp, "nk-bench", true)
	direct := startDirectNode(b, "203.0.113.0/24")
	image := n.ctd.BusyboxImage()
	for _, pods := range []int{1, 30} {
		b.Run(fmt.Sprintf("containerd/pods=%d", pods), func(b *testing.B) {
			var lat []time.Duration
			for i := 0; i < b.N; i++ {
				lat = append(lat, direct.startDirect(b, image, pods)...)
			}
			report(b, lat)
		})
		b.Run(fmt.Sprintf("kubelet/pods=%d", pods), func(b *testing.B) {
			var lat []time.Duration
			for i := 0; i < b.N; i++ {
				lat = append(lat, n.startThroughAPI(b, image, pods, i)...)
			}
			report(b, lat)
		})
	}
}

func report(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		return
	}
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// startDirect runs pods sandboxes with one container each through CRI, as the kubelet
// would, and removes them; it returns each pod's start latency.
func (n *testNode) startDirect(b *testing.B, image string, pods int) []time.Duration {
	ctx := context.Background()
	lat := make([]time.Duration, pods)
	ids := make([]string, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := busyboxPod(fmt.Sprintf("direct-%d", i), image, corev1.RestartPolicyAlways, "sleep 3600")
			pod.UID = uuid.NewUUID()
			start := time.Now()
			sc, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: n.dir + "/direct-logs"})
			if err != nil {
				b.Error(err)
				return
			}
			id, err := n.runtime.RunPodSandbox(ctx, sc, "")
			if err != nil {
				b.Error(err)
				return
			}
			ids[i] = id
			cc, err := cri.ContainerConfig(pod, "main", 0, image)
			if err != nil {
				b.Error(err)
				return
			}
			cid, err := n.runtime.CreateContainer(ctx, id, cc, sc)
			if err != nil {
				b.Error(err)
				return
			}
			if err := n.runtime.StartContainer(ctx, cid); err != nil {
				b.Error(err)
				return
			}
			lat[i] = time.Since(start)
		}()
	}
	wg.Wait()
	b.StopTimer()
	for _, id := range ids {
		if id != "" {
			_ = n.runtime.StopPodSandbox(ctx, id)
			_ = n.runtime.RemovePodSandbox(ctx, id)
		}
	}
	b.StartTimer()
	return lat
}

// startThroughAPI creates pods bound to the node and waits for each to be Ready.
func (n *testNode) startThroughAPI(b *testing.B, image string, pods, round int) []time.Duration {
	ctx := context.Background()
	lat := make([]time.Duration, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := busyboxPod(fmt.Sprintf("bench-%d-%d", round, i), image, corev1.RestartPolicyAlways, "sleep 3600")
			pod.Spec.NodeName = n.name
			start := time.Now()
			if _, err := n.admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				b.Error(err)
				return
			}
			for time.Since(start) < 2*time.Minute {
				p, err := n.admin.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
				if err == nil && podReady(p) {
					lat[i] = time.Since(start)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			b.Errorf("pod %s not Ready in 2m", pod.Name)
		}()
	}
	wg.Wait()
	b.StopTimer()
	for i := range pods {
		_ = n.admin.CoreV1().Pods("default").Delete(ctx, fmt.Sprintf("bench-%d-%d", round, i), metav1.DeleteOptions{})
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		list, err := n.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.StartTimer()
	return lat
}
