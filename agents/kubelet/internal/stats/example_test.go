package stats_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/stats"
	"github.com/nodekit-dev/nodekit/cri"
)

// The kubelet server mounts the two handlers behind its authentication and
// authorization filters (nodes/stats and nodes/metrics).
func Example() {
	ctx := context.Background()
	client, err := cri.New(ctx, cri.Config{Endpoint: "unix:///run/containerd/containerd.sock", CallTimeout: 2 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	p, err := stats.New(stats.Config{
		Runtime:    stats.CRIRuntime(client),
		NodeName:   "node-1",
		RootDir:    "/var/lib/kubelet",
		PodLogsDir: "/var/log/pods",
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/stats/summary", p.SummaryHandler())
	mux.Handle("/metrics/resource", p.ResourceMetricsHandler())
	_ = http.ListenAndServe("127.0.0.1:10255", mux)
}
