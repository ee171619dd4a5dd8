package main

import (
	"context"
	"net"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/nodekit-dev/nodekit/cri"
)

type podManagerConfig struct {
	client   kubernetes.Interface
	nodeName string
	cfg      *kubeletv1beta1.KubeletConfiguration
	rootDir  string
	runtime  *cri.Client
	recorder record.EventRecorder
	health   *health
	node     *nodeStatus
	nodeIP   net.IP
}

// podManager will run the pods bound to this node; for now it only keeps the sync
// loop's health tick.
type podManager struct{ cfg podManagerConfig }

func newPodManager(cfg podManagerConfig) (*podManager, error) { return &podManager{cfg: cfg}, nil }

func (m *podManager) run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		m.cfg.health.tick()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
