package lease_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nodekit-dev/nodekit/lease"
	"github.com/nodekit-dev/nodekit/lease/leasetest"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"
)

// The node heartbeat against the leasetest fake, with a fake clock: one round
// creates the lease, each later round is a single Update.
func Example() {
	api := leasetest.New(leasetest.Node("node-1", "0b4e7c1a"))
	clk := testingclock.NewFakeClock(time.Date(2026, 7, 16, 9, 14, 0, 0, time.UTC))

	cfg := lease.NodeConfig(api.Clientset, "node-1")
	cfg.Clock = clk
	heartbeat, err := lease.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- heartbeat.Run(ctx) }()

	waitRound := func() {
		for !clk.HasWaiters() { // the controller sleeps between rounds
			time.Sleep(time.Millisecond)
		}
	}
	waitRound()
	fmt.Print(api.Dump())
	fmt.Println(api.Requests())

	api.ResetRequests()
	clk.Step(heartbeat.RenewInterval() * 104 / 100) // the longest jittered wait
	waitRound()
	fmt.Print(api.Dump())
	fmt.Println(api.Requests())

	cancel()
	fmt.Println("Run returned", <-done)
	// Output:
	// kube-node-lease/node-1 holder=node-1 duration=40s renew=2026-07-16T09:14:00Z owners=v1/Node/node-1 rv=1
	// [get lease kube-node-lease/node-1 get node node-1 create lease kube-node-lease/node-1]
	// kube-node-lease/node-1 holder=node-1 duration=40s renew=2026-07-16T09:14:10.4Z owners=v1/Node/node-1 rv=2
	// [update lease kube-node-lease/node-1]
	// Run returned <nil>
}

// Fresh judges a lease by its own fields and the reader's clock.
func ExampleFresh() {
	renewed := time.Date(2026, 7, 16, 9, 14, 0, 0, time.UTC)
	l := leasetest.Lease("kube-node-lease", "node-1", "node-1", renewed, 40*time.Second)
	for _, after := range []time.Duration{10 * time.Second, 39 * time.Second, 40 * time.Second} {
		fmt.Printf("%v after renewal: fresh=%v\n", after, lease.Fresh(l, renewed.Add(after)))
	}
	// Output:
	// 10s after renewal: fresh=true
	// 39s after renewal: fresh=true
	// 40s after renewal: fresh=false
}

// Heartbeating your own agent's lease next to its real work. The agent's
// credentials need get, create and update on leases in its namespace.
func ExampleConfig_ownAgent() {
	restConfig, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(restConfig)
	heartbeat, err := lease.New(lease.Config{
		Client:         client,
		Namespace:      "disk-agents",
		Name:           "disk-agent-worker-2",
		HolderIdentity: "disk-agent-worker-2",
		Duration:       20 * time.Second, // renewed every 5s
		OnRepeatedFailure: func() {
			log.Print("heartbeat failing: the API server is unreachable or refusing")
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = heartbeat.Run(ctx) }() // ends when the agent cancels ctx
	// ... the agent's own work ...
}

// Watching node leases the way the node lifecycle controller does.
func ExampleWatcher() {
	restConfig, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	w, err := lease.NewWatcher(lease.WatcherConfig{
		Client: kubernetes.NewForConfigOrDie(restConfig),
		OnTransition: func(t lease.Transition) {
			log.Printf("%v; last renewTime %v", t, t.RenewTime)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = w.Run(context.Background())
}
