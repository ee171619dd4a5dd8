package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/stats"
	"github.com/nodekit-dev/nodekit/podsync"
)

// nodeEvictionStats reads the real node: the stats summary of internal/stats,
// plus what that summary leaves out and eviction needs, as cAdvisor gives it to
// the kubelet: the pods cgroup's memory (the "pods" system container) and the
// usage of each pod's emptyDir volumes (the volume stats).
type nodeEvictionStats struct {
	provider *stats.Provider
	imageFs  func(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error)
	rootDir  string
	cgroups  *podCgroups
}

func (s *nodeEvictionStats) summary(ctx context.Context, pods []*corev1.Pod) (*statsapi.Summary, error) {
	sum, err := s.provider.Summary(ctx)
	if err != nil {
		return nil, err
	}
	if s.cgroups != nil && s.cgroups.perQOS {
		if mem, err := s.cgroups.allocatableMemory(); err != nil {
			klog.V(4).InfoS("Eviction manager: no memory figures of the pods cgroup", "err", err)
		} else if mem != nil {
			sum.Node.SystemContainers = append(sum.Node.SystemContainers, statsapi.ContainerStats{
				Name: statsapi.SystemContainerPods, StartTime: sum.Node.StartTime, Memory: mem,
			})
		}
	}
	byUID := map[string]*corev1.Pod{}
	for _, p := range pods {
		byUID[string(p.UID)] = p
	}
	for i := range sum.Pods {
		ps := &sum.Pods[i]
		pod := byUID[ps.PodRef.UID]
		if pod == nil {
			continue
		}
		addEmptyDirStats(ps, pod, filepath.Join(s.rootDir, "pods", ps.PodRef.UID, "volumes", "kubernetes.io~empty-dir"))
	}
	return sum, nil
}

// addEmptyDirStats measures the pod's emptyDir volumes as the kubelet's du-based
// volume metrics do (allocated blocks and inodes, not crossing into other file
// systems) and counts the disk-backed ones in the pod's ephemeral storage.
func addEmptyDirStats(ps *statsapi.PodStats, pod *corev1.Pod, dir string) {
	now := metav1.Now()
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil {
			continue
		}
		bytes, inodes, err := diskUsage(filepath.Join(dir, v.Name))
		if err != nil {
			continue
		}
		ps.VolumeStats = append(ps.VolumeStats, statsapi.VolumeStats{
			Name:    v.Name,
			FsStats: statsapi.FsStats{Time: now, UsedBytes: &bytes, InodesUsed: &inodes},
		})
		if v.EmptyDir.Medium != corev1.StorageMediumDefault {
			continue
		}
		if ps.EphemeralStorage == nil {
			ps.EphemeralStorage = &statsapi.FsStats{Time: now}
		}
		used := bytes
		if ps.EphemeralStorage.UsedBytes != nil {
			used += *ps.EphemeralStorage.UsedBytes
		}
		ps.EphemeralStorage.UsedBytes = &used
		count := inodes
		if ps.EphemeralStorage.InodesUsed != nil {
			count += *ps.EphemeralStorage.InodesUsed
		}
		ps.EphemeralStorage.InodesUsed = &count
	}
}

// diskUsage is `du -x -s -B 1`: the blocks allocated to everything under dir on
// dir's file system, and the number of inodes.
func diskUsage(dir string) (bytes, inodes uint64, err error) {
	var root syscall.Stat_t
	if err := syscall.Lstat(dir, &root); err != nil {
		return 0, 0, err
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		bytes += uint64(st.Blocks) * 512
		inodes++
		return nil
	})
	return bytes, inodes, err
}

// dedicatedImageFs compares the device of the runtime's image file system with
// the root dir's, as the kubelet's HasDedicatedImageFs does.
func (s *nodeEvictionStats) dedicatedImageFs(ctx context.Context) (bool, error) {
	resp, err := s.imageFs(ctx)
	if err != nil {
		return false, err
	}
	fss := resp.GetImageFilesystems()
	if len(fss) == 0 {
		return false, fmt.Errorf("the runtime reported no image file system")
	}
	var img, root syscall.Stat_t
	if err := syscall.Stat(fss[0].GetFsId().GetMountpoint(), &img); err != nil {
		return false, fmt.Errorf("stat image file system: %w", err)
	}
	if err := syscall.Stat(s.rootDir, &root); err != nil {
		return false, fmt.Errorf("stat root dir: %w", err)
	}
	return img.Dev != root.Dev, nil
}

// allocatableMemory is the pods cgroup's memory as cAdvisor reports it for the
// "pods" system container: the working set (usage minus inactive file pages) and,
// when the cgroup has a memory limit, what is available under it. nil when the
// cgroup has no limit (no signal, as upstream).
func (c *podCgroups) allocatableMemory() (*statsapi.MemoryStats, error) {
	var usage, limit uint64
	var stat map[string]uint64
	var err error
	inactiveKey := "total_inactive_file"
	if c.v2 {
		dir := filepath.Join(c.mountRoot, c.root)
		if usage, err = readCgroupUint(filepath.Join(dir, "memory.current")); err != nil {
			return nil, err
		}
		var raw []byte
		if raw, err = os.ReadFile(filepath.Join(dir, "memory.max")); err != nil {
			return nil, err
		}
		if strings.TrimSpace(string(raw)) == "max" {
			return nil, nil
		}
		if limit, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err != nil {
			return nil, err
		}
		stat, err = readCgroupStat(filepath.Join(dir, "memory.stat"))
		inactiveKey = "inactive_file"
	} else {
		dir := filepath.Join(c.mountRoot, "memory", c.root)
		if usage, err = readCgroupUint(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
			return nil, err
		}
		if limit, err = readCgroupUint(filepath.Join(dir, "memory.limit_in_bytes")); err != nil {
			return nil, err
		}
		// cgroup v1 writes "unlimited" as the largest page-aligned int64.
		if limit >= 1<<62 {
			return nil, nil
		}
		stat, err = readCgroupStat(filepath.Join(dir, "memory.stat"))
	}
	if err != nil {
		return nil, err
	}
	ws := usage - min(usage, stat[inactiveKey])
	avail := limit - min(limit, ws)
	return &statsapi.MemoryStats{Time: metav1.Now(), UsageBytes: &usage, WorkingSetBytes: &ws, AvailableBytes: &avail}, nil
}

func readCgroupUint(path string) (uint64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
}

func readCgroupStat(path string) (map[string]uint64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for line := range strings.Lines(string(raw)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// evictionRequest is an eviction handed to a pod's worker.
type evictionRequest struct {
	grace int64
	apply func(*corev1.PodStatus)
	done  chan struct{}
	once  sync.Once
}

// evictionCandidates are the kubelet's active pods, less those already being
// evicted.
func (m *podManager) evictionCandidates() []*corev1.Pod {
	active := m.activePods()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := active[:0]
	for _, p := range active {
		if e, ok := m.pods[p.UID]; ok && e.evict == nil && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// evictPod marks the pod for eviction and wakes its worker, which kills it in
// its next sync (syncEvicted).
func (m *podManager) evictPod(pod *corev1.Pod, grace int64, apply func(*corev1.PodStatus)) (<-chan struct{}, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[pod.UID]
	if !ok || e.gone {
		return nil, false
	}
	if e.evict == nil {
		e.evict = &evictionRequest{grace: grace, apply: apply, done: make(chan struct{})}
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return e.evict.done, true
}

// evicting returns the pod's eviction, if one was asked for.
func (m *podManager) evicting(e *podEntry) *evictionRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return e.evict
}

// syncEvicted is the sync of an evicted pod, as the kubelet's killPodNow and
// SyncTerminatingPod do it: kill with the eviction's grace, the final status with
// the eviction's phase, reason, message and condition, then unmount its volumes
// (a memory-backed emptyDir's pages go with them), as the kubelet does for a
// terminated pod before the eviction manager's next round. The pod cgroup stays
// until the pod is deleted, as for any terminal pod here: containerd 1.6 fails
// ListPodSandboxStats for a stopped sandbox whose cgroup is gone. It runs again on every
// later sync until the pod is deleted, which changes nothing once done.
func (m *podManager) syncEvicted(ctx context.Context, e *podEntry, pod *corev1.Pod, req *evictionRequest) (bool, error) {
	m.probes.StopLivenessAndStartup(pod)
	view, err := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, nil)
	if err != nil {
		return false, fmt.Errorf("read runtime state of pod %s: %w", podDesc(pod), err)
	}
	grace := req.grace
	if res := m.syncer.KillPod(ctx, pod, view, &grace); res.Error() != nil {
		return false, res.Error()
	}
	st := m.computeStatus(ctx, pod, true)
	req.apply(st)
	m.setStatus(e, st)
	m.status.write(ctx, pod, e.static, st)
	m.probes.RemovePod(pod)
	if err := m.volumes.Teardown(ctx, pod.UID); err != nil {
		return false, fmt.Errorf("tear down volumes of evicted pod %s: %w", podDesc(pod), err)
	}
	req.once.Do(func() { close(req.done) })
	return false, nil
}
