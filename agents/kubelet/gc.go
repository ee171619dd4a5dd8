package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/stats"
	"github.com/nodekit-dev/nodekit/cri"
)

// Container garbage collection, as the kubelet's containerGC (pkg/kubelet/kuberuntime
// kuberuntime_gc.go, v1.37.2) run every minute by StartGarbageCollection.
//
// A dead container (not running) created at least minAge ago is evictable. Each
// (pod UID, container name) is an evict unit. Every minute:
//
//  1. once the pod sources have loaded, every evictable container of a pod no longer
//     on the node goes;
//  2. each unit keeps its newest maxPerPodContainer dead containers (default 1: the
//     previous instance, which `kubectl logs --previous` and the status's lastState
//     read; the restart count is on the newest container's annotation, so it survives);
//  3. with maxContainers >= 0, units are cut to an equal share (at least 1), then
//     the oldest dead containers go until at most maxContainers remain;
//  4. a sandbox that is not ready and holds no container goes when its pod is no
//     longer on the node, or when it is not the pod's newest sandbox;
//  5. once the sources have loaded, the log folder <podLogsDir>/<ns>_<name>_<uid> of
//     every pod no longer on the node goes.
//
// A container in unknown state is stopped before it is removed; containers are removed
// through the agent's runtime, which takes their log files first.

// containerGCPeriod is the kubelet's ContainerGCPeriod.
const containerGCPeriod = time.Minute

// minContainerStopGrace is what the kubelet gives a container it stops without a pod
// (minimumGracePeriodInSeconds).
const minContainerStopGrace = 2 * time.Second

// containerGCPolicy is the kubelet's GCPolicy, from its deprecated flags
// --minimum-container-ttl-duration, --maximum-dead-containers-per-container and
// --maximum-dead-containers.
type containerGCPolicy struct {
	// minAge: a dead container younger than this (by creation time) is kept. Default 0.
	minAge time.Duration
	// maxPerPodContainer: dead containers kept per pod and container name; negative
	// means no limit. Default 1.
	maxPerPodContainer int
	// maxContainers: dead containers kept on the node; negative means no limit.
	// Default -1.
	maxContainers int
}

func defaultContainerGCPolicy() containerGCPolicy {
	return containerGCPolicy{minAge: 0, maxPerPodContainer: 1, maxContainers: -1}
}

// gcRuntime is the part of the CRI the container garbage collector calls.
type gcRuntime interface {
	ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	StopContainer(ctx context.Context, id string, grace time.Duration) error
	RemoveContainer(ctx context.Context, id string) error
	StopPodSandbox(ctx context.Context, id string) error
	RemovePodSandbox(ctx context.Context, id string) error
}

// podContentRemover tells whether everything of a pod may be removed: its sources
// have loaded and the pod is no longer on the node (ShouldPodContentBeRemoved).
type podContentRemover func(uid types.UID) bool

type containerGC struct {
	runtime    gcRuntime
	policy     containerGCPolicy
	clock      clock.Clock
	podLogsDir string
	removable  podContentRemover
	// sourcesReady: the API and static pod sources have loaded once.
	sourcesReady func() bool
}

type gcContainer struct {
	id, name string
	created  time.Time
	unknown  bool
}

type evictUnit struct {
	uid  types.UID
	name string
}

// newestFirst sorts by creation time, newest first.
func newestFirst(cs []gcContainer) {
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].created.After(cs[j].created) })
}

// garbageCollect runs one round; errors of the listing and folder steps are joined,
// failures to remove one container or sandbox are logged and left for the next round
// as the kubelet does.
func (g *containerGC) garbageCollect(ctx context.Context) error {
	var errs []error
	if err := g.evictContainers(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := g.evictSandboxes(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := g.evictPodLogsDirectories(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (g *containerGC) evictableContainers(ctx context.Context) (map[evictUnit][]gcContainer, error) {
	containers, err := g.runtime.ListContainers(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	newest := g.clock.Now().Add(-g.policy.minAge)
	units := map[evictUnit][]gcContainer{}
	for _, c := range containers {
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		created := time.Unix(0, c.GetCreatedAt())
		if newest.Before(created) {
			continue
		}
		key := evictUnit{uid: types.UID(c.GetLabels()[cri.LabelPodUID]), name: c.GetMetadata().GetName()}
		units[key] = append(units[key], gcContainer{
			id: c.GetId(), name: key.name, created: created,
			unknown: c.GetState() == runtimeapi.ContainerState_CONTAINER_UNKNOWN,
		})
	}
	return units, nil
}

func (g *containerGC) evictContainers(ctx context.Context) error {
	units, err := g.evictableContainers(ctx)
	if err != nil {
		return err
	}
	if g.sourcesReady() {
		for key, cs := range units {
			if g.removable(key.uid) {
				g.removeOldest(ctx, cs, len(cs))
				delete(units, key)
			}
		}
	}
	if g.policy.maxPerPodContainer >= 0 {
		g.enforcePerUnit(ctx, units, g.policy.maxPerPodContainer)
	}
	if g.policy.maxContainers >= 0 && countContainers(units) > g.policy.maxContainers {
		share := max(g.policy.maxContainers/len(units), 1)
		g.enforcePerUnit(ctx, units, share)
		if n := countContainers(units); n > g.policy.maxContainers {
			all := make([]gcContainer, 0, n)
			for _, cs := range units {
				all = append(all, cs...)
			}
			g.removeOldest(ctx, all, n-g.policy.maxContainers)
		}
	}
	return nil
}

func countContainers(units map[evictUnit][]gcContainer) int {
	n := 0
	for _, cs := range units {
		n += len(cs)
	}
	return n
}

func (g *containerGC) enforcePerUnit(ctx context.Context, units map[evictUnit][]gcContainer, keep int) {
	for key, cs := range units {
		if extra := len(cs) - keep; extra > 0 {
			units[key] = g.removeOldest(ctx, cs, extra)
		}
	}
}

// removeOldest removes the n oldest of cs and returns the others, counting every
// attempted removal as done so that a failing one does not make the round remove more.
func (g *containerGC) removeOldest(ctx context.Context, cs []gcContainer, n int) []gcContainer {
	keep := len(cs) - n
	newestFirst(cs)
	for i := len(cs) - 1; i >= keep; i-- {
		c := cs[i]
		if c.unknown {
			if err := g.runtime.StopContainer(ctx, c.id, minContainerStopGrace); err != nil && !errors.Is(err, cri.ErrNotFound) {
				klog.ErrorS(err, "Failed to stop container", "containerID", c.id)
				continue
			}
		}
		klog.V(4).InfoS("Removing dead container", "containerID", c.id, "containerName", c.name)
		if err := g.runtime.RemoveContainer(ctx, c.id); err != nil && !errors.Is(err, cri.ErrNotFound) {
			klog.ErrorS(err, "Failed to remove container", "containerID", c.id)
		}
	}
	return cs[:keep]
}

type gcSandbox struct {
	id      string
	created time.Time
	// active: ready, or still holding containers.
	active bool
}

func (g *containerGC) evictSandboxes(ctx context.Context) error {
	containers, err := g.runtime.ListContainers(ctx, nil)
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	sandboxes, err := g.runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return fmt.Errorf("list pod sandboxes: %w", err)
	}
	holding := map[string]bool{}
	for _, c := range containers {
		holding[c.GetPodSandboxId()] = true
	}
	byPod := map[types.UID][]gcSandbox{}
	for _, s := range sandboxes {
		uid := types.UID(s.GetMetadata().GetUid())
		byPod[uid] = append(byPod[uid], gcSandbox{
			id: s.GetId(), created: time.Unix(0, s.GetCreatedAt()),
			active: s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY || holding[s.GetId()],
		})
	}
	for uid, sbs := range byPod {
		sort.SliceStable(sbs, func(i, j int) bool { return sbs[i].created.After(sbs[j].created) })
		keep := 1
		if g.sourcesReady() && g.removable(uid) {
			// Gone: even the newest dead one goes.
			keep = 0
		}
		for _, s := range sbs[min(keep, len(sbs)):] {
			if s.active {
				continue
			}
			g.removeSandbox(ctx, s.id)
		}
	}
	return nil
}

func (g *containerGC) removeSandbox(ctx context.Context, id string) {
	klog.V(4).InfoS("Removing sandbox", "sandboxID", id)
	// As the kubelet: stop it first in case nothing did.
	if err := g.runtime.StopPodSandbox(ctx, id); err != nil && !errors.Is(err, cri.ErrNotFound) {
		klog.ErrorS(err, "Failed to stop sandbox before removing", "sandboxID", id)
		return
	}
	if err := g.runtime.RemovePodSandbox(ctx, id); err != nil && !errors.Is(err, cri.ErrNotFound) {
		klog.ErrorS(err, "Failed to remove sandbox", "sandboxID", id)
	}
}

// evictPodLogsDirectories removes the log folders of pods no longer on the node. A
// folder's name ends with the pod's UID after the last "_".
func (g *containerGC) evictPodLogsDirectories(ctx context.Context) error {
	if !g.sourcesReady() {
		return nil
	}
	entries, err := os.ReadDir(g.podLogsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to read podLogsDirectory %q: %w", g.podLogsDir, err)
	}
	for _, e := range entries {
		name := e.Name()
		uid := types.UID(name[strings.LastIndex(name, "_")+1:])
		if !g.removable(uid) {
			continue
		}
		klog.V(4).InfoS("Removing pod logs", "podUID", uid)
		if err := os.RemoveAll(filepath.Join(g.podLogsDir, name)); err != nil {
			klog.ErrorS(err, "Failed to remove pod logs directory", "path", name)
		}
	}
	return ctx.Err()
}

// gcIntervals are the rounds' periods: the kubelet's constants, which the real-parts
// tests shorten through NODEKIT_KUBELET_CONTAINER_GC_PERIOD and
// NODEKIT_KUBELET_IMAGE_GC_PERIOD (Go durations; not upstream, for tests only).
type gcIntervals struct{ containers, images time.Duration }

func gcPeriods() gcIntervals {
	p := gcIntervals{containers: containerGCPeriod, images: imageGCPeriod}
	for _, o := range []struct {
		env string
		d   *time.Duration
	}{{"NODEKIT_KUBELET_CONTAINER_GC_PERIOD", &p.containers}, {"NODEKIT_KUBELET_IMAGE_GC_PERIOD", &p.images}} {
		if v := os.Getenv(o.env); v != "" {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				klog.InfoS("Garbage collection period overridden for tests", "env", o.env, "period", d)
				*o.d = d
			}
		}
	}
	return p
}

// newGarbageCollectors builds the container and image garbage collectors from the
// flags and the KubeletConfiguration.
func newGarbageCollectors(ctx context.Context, o *options, cfg *kubeletv1beta1.KubeletConfiguration, runtime *cri.Client,
	logs *containerLogManager, pods *podManager, nodeName, rootDir string, nodeEvent func(reason, message string)) (*containerGC, *imageGC, error) {
	cgc := &containerGC{
		runtime: logCleaningRuntime{Client: runtime, logs: logs},
		policy: containerGCPolicy{
			minAge: o.minimumContainerTTL, maxPerPodContainer: int(o.maxDeadPerContainer), maxContainers: int(o.maxDeadContainers),
		},
		clock: clock.RealClock{}, podLogsDir: cfg.PodLogsDir,
		removable: pods.podContentRemovable, sourcesReady: pods.sourcesReady,
	}
	sp, err := stats.New(stats.Config{Runtime: stats.CRIRuntime(runtime), NodeName: nodeName, RootDir: rootDir, PodLogsDir: cfg.PodLogsDir})
	if err != nil {
		return nil, nil, fmt.Errorf("image garbage collector: %w", err)
	}
	policy := imageGCPolicy{
		highThresholdPercent: int(*cfg.ImageGCHighThresholdPercent), lowThresholdPercent: int(*cfg.ImageGCLowThresholdPercent),
		minAge: cfg.ImageMinimumGCAge.Duration, maxAge: cfg.ImageMaximumGCAge.Duration,
	}
	igc := newImageGC(runtime, policy, clock.RealClock{}, sp.ImageFsStats, nodeEvent)
	igc.sandboxImage = runtimeSandboxImage(ctx, runtime)
	return cgc, igc, nil
}

// runtimeSandboxImage is the sandbox image in containerd's CRI configuration (the
// "config" entry of a verbose CRI Status: {"sandboxImage": ...}), or "".
func runtimeSandboxImage(ctx context.Context, runtime *cri.Client) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := runtime.RuntimeService().Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		klog.V(2).InfoS("Could not read the runtime's sandbox image", "err", err)
		return ""
	}
	var c struct {
		SandboxImage string `json:"sandboxImage"`
	}
	if raw := resp.GetInfo()["config"]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &c); err != nil {
			klog.V(2).InfoS("Could not read the runtime's sandbox image", "err", err)
		}
	}
	if c.SandboxImage != "" {
		klog.V(2).InfoS("The runtime's sandbox image is kept by image garbage collection", "image", c.SandboxImage)
	}
	return c.SandboxImage
}
