package staticpod_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodekit-dev/nodekit/staticpod"
	"github.com/nodekit-dev/nodekit/staticpod/staticpodtest"
)

// BenchmarkLoad1000 loads a folder of 1,000 manifests (a copy of the kubeadm
// kube-apiserver manifest under 1,000 names), the kubelet's work on every rescan.
func BenchmarkLoad1000(b *testing.B) {
	dir := b.TempDir()
	data, err := os.ReadFile(filepath.Join("testdata", "kubeadm", "kube-apiserver.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		name := fmt.Sprintf("pod-%04d", i)
		m := strings.Replace(string(data), "  name: kube-apiserver\n", "  name: "+name+"\n", 1)
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(m), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	cfg := staticpod.Config{Dir: dir, NodeName: "node-a"}
	b.ResetTimer()
	for b.Loop() {
		snap, err := staticpod.Load(context.Background(), cfg)
		if err != nil || len(snap.Pods) != 1000 || len(snap.Errors) != 0 {
			b.Fatalf("loaded %d pods, errors %v, err %v", len(snap.Pods), snap.Errors, err)
		}
	}
}

// BenchmarkWriteToEvent measures the time from an atomic manifest write (temp file
// plus rename) to the watcher's EventUpdate, one edit per iteration, and reports the
// median and 99th percentile. Run with -benchtime=100x for 100 edits.
func BenchmarkWriteToEvent(b *testing.B) {
	dir := b.TempDir()
	staticpodtest.WriteManifest(b, dir, "web.yaml", podYAML("web", "nginx:0"))
	w, err := staticpod.New(staticpod.Config{Dir: dir, NodeName: "node-a", RescanPeriod: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if ev := <-w.Events(); ev.Type != staticpod.EventSync {
		b.Fatalf("first event %v", ev.Type)
	}

	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		data := podYAML("web", fmt.Sprintf("nginx:%d", i+1))
		start := time.Now()
		staticpodtest.WriteManifest(b, dir, "web.yaml", data)
		for {
			ev := <-w.Events()
			if ev.Type == staticpod.EventUpdate {
				break
			}
			if ev.Type == staticpod.EventError {
				b.Fatalf("unexpected error event: %v", ev.Err)
			}
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(samples[len(samples)/2]), "median-ms")
	b.ReportMetric(ms(samples[(len(samples)*99)/100]), "p99-ms")
}
