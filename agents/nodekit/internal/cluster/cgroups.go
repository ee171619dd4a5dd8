package cluster

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
)

// cgroupRootFor is the cgroup a node's kubelet is given as its cgroupRoot. Every node of
// every cluster gets its own: kubelets sharing one root would share one kubepods tree,
// and each kubelet removes the pod cgroups (and kills the processes) of pods it does
// not know, as the upstream kubelet does.
func cgroupRootFor(cluster, node string) string {
	return "/nodekit-" + cluster + "-" + node
}

func cgroupManager(root string) (cgroups.Manager, error) {
	cg := &cgroups.Cgroup{Path: root, Resources: &cgroups.Resources{SkipDevices: true}}
	if cgroups.IsCgroup2UnifiedMode() {
		return fs2.NewManager(cg, filepath.Join("/sys/fs/cgroup", root))
	}
	return fs.NewManager(cg, nil)
}

// makeCgroupRoot creates root in every controller (the kubelet requires its cgroupRoot
// to exist).
func makeCgroupRoot(root string) error {
	m, err := cgroupManager(root)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", root, err)
	}
	if err := m.Apply(-1); err != nil {
		return fmt.Errorf("create cgroup %s: %w", root, err)
	}
	return nil
}

// removeCgroupRoot kills what is left in root (containerd is stopped by then, so only
// strays) and removes it with everything the kubelet made under it.
func removeCgroupRoot(root string) error {
	m, err := cgroupManager(root)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", root, err)
	}
	for range 25 {
		left := 0
		for _, p := range m.GetPaths() {
			pids, _ := cgroups.GetAllPids(p)
			for _, pid := range pids {
				left++
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, p := range m.GetPaths() {
		if err := cgroups.RemovePath(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", root, err)
	}
	return nil
}
