package stats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/cri"
)

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("invalid stats config")

// Config configures a Provider.
type Config struct {
	// Runtime answers the CRI calls. Required; CRIRuntime adapts a *cri.Client.
	Runtime Runtime
	// NodeName is Summary.Node.NodeName. Required.
	NodeName string
	// RootDir is the kubelet's root directory; its file system is the node's fs
	// and the capacity behind container logs. Default /var/lib/kubelet.
	RootDir string
	// PodLogsDir holds the pods' logs (<ns>_<name>_<uid>/<container>/). Default
	// /var/log/pods, the kubelet's podLogsDir.
	PodLogsDir string
	// Clock stamps figures the runtime does not stamp itself (file systems,
	// rlimit, network, the node's CPU). Default the real clock.
	Clock clock.PassiveClock
}

// Provider builds the kubelet's stats summary from the CRI and the node's /proc
// and root cgroup, and serves it as /stats/summary and /metrics/resource.
type Provider struct {
	cfg  Config
	host host

	// mu guards the previous CPU samples that usageNanoCores is derived from.
	mu       sync.Mutex
	nodeCPU  cpuSample
	cpuCache map[string]cpuSample // by container or sandbox ID

	metrics *resourceMetrics
}

type cpuSample struct {
	at    time.Time
	usage uint64 // cumulative core-nanoseconds
}

// New validates cfg and returns a Provider.
func New(cfg Config) (*Provider, error) {
	if cfg.Runtime == nil {
		return nil, fmt.Errorf("%w: Runtime is required", ErrInvalidConfig)
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("%w: NodeName is required", ErrInvalidConfig)
	}
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	if cfg.PodLogsDir == "" {
		cfg.PodLogsDir = "/var/log/pods"
	}
	if !filepath.IsAbs(cfg.RootDir) {
		return nil, fmt.Errorf("%w: RootDir %q is not absolute", ErrInvalidConfig, cfg.RootDir)
	}
	if !filepath.IsAbs(cfg.PodLogsDir) {
		return nil, fmt.Errorf("%w: PodLogsDir %q is not absolute", ErrInvalidConfig, cfg.PodLogsDir)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	p := &Provider{cfg: cfg, host: realHost(), cpuCache: map[string]cpuSample{}}
	p.metrics = newResourceMetrics(p)
	return p, nil
}

// Summary returns the full summary, as GET /stats/summary serves it.
func (p *Provider) Summary(ctx context.Context) (*statsapi.Summary, error) {
	return p.summary(ctx, true)
}

// CPUAndMemory returns the summary trimmed to CPU, memory and swap, as
// /stats/summary?only_cpu_and_memory=true serves it and /metrics/resource uses it.
func (p *Provider) CPUAndMemory(ctx context.Context) (*statsapi.Summary, error) {
	return p.summary(ctx, false)
}

func (p *Provider) summary(ctx context.Context, full bool) (*statsapi.Summary, error) {
	node, err := p.nodeStats(full)
	if err != nil {
		return nil, fmt.Errorf("node %s stats: %w", p.cfg.NodeName, err)
	}
	var imageFs *statsapi.FsStats
	if full {
		imageFs, err = p.imageFsStats(ctx)
		if err != nil {
			return nil, err
		}
		node.Runtime = &statsapi.RuntimeStats{ImageFs: imageFs, ContainerFs: imageFs}
	}
	pods, err := p.podStats(ctx, full, *node.Swap.SwapAvailableBytes+*node.Swap.SwapUsageBytes > 0)
	if err != nil {
		return nil, err
	}
	return &statsapi.Summary{Node: *node, Pods: pods}, nil
}

func (p *Provider) nodeStats(full bool) (*statsapi.NodeStats, error) {
	now := p.cfg.Clock.Now()
	boot, err := p.host.bootTime()
	if err != nil {
		return nil, err
	}
	cpu, err := p.host.cpuUsage()
	if err != nil {
		return nil, err
	}
	mem, err := p.host.memory()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	nanoCores := usageNanoCores(p.nodeCPU, cpuSample{at: now, usage: cpu})
	p.nodeCPU = cpuSample{at: now, usage: cpu}
	p.mu.Unlock()

	t := metav1.NewTime(now)
	available := uint64(0)
	if mem.capacity > mem.workingSet {
		available = mem.capacity - mem.workingSet
	}
	node := &statsapi.NodeStats{
		NodeName:  p.cfg.NodeName,
		StartTime: metav1.NewTime(boot),
		CPU:       &statsapi.CPUStats{Time: t, UsageNanoCores: nanoCores, UsageCoreNanoSeconds: ptr(cpu)},
		Memory: &statsapi.MemoryStats{
			Time:            t,
			AvailableBytes:  ptr(available),
			UsageBytes:      ptr(mem.usage),
			WorkingSetBytes: ptr(mem.workingSet),
			RSSBytes:        ptr(mem.rss),
			PageFaults:      ptr(mem.pageFaults),
			MajorPageFaults: ptr(mem.majorPageFaults),
		},
		Swap: &statsapi.SwapStats{
			Time:               t,
			SwapAvailableBytes: ptr(mem.swapFree),
			SwapUsageBytes:     ptr(mem.swapTotal - min(mem.swapFree, mem.swapTotal)),
		},
	}
	if !full {
		return node, nil
	}
	rootFs, err := p.host.statfs(p.cfg.RootDir)
	if err != nil {
		return nil, err
	}
	node.Fs = fsStats(t, rootFs)
	maxPID, err := p.host.maxPID()
	if err != nil {
		return nil, err
	}
	procs, err := p.host.procCount()
	if err != nil {
		return nil, err
	}
	node.Rlimit = &statsapi.RlimitStats{Time: t, MaxPID: ptr(int64(maxPID)), NumOfRunningProcesses: ptr(int64(procs))}
	if ifaces, err := p.host.network(); err == nil {
		node.Network = networkStats(t, ifaces)
	}
	return node, nil
}

// defaultInterface is the interface whose counters a NetworkStats carries at its
// top level, as the kubelet's.
const defaultInterface = "eth0"

func networkStats(t metav1.Time, ifaces []netInterface) *statsapi.NetworkStats {
	n := &statsapi.NetworkStats{Time: t}
	for _, i := range ifaces {
		s := statsapi.InterfaceStats{Name: i.name, RxBytes: ptr(i.rxBytes), RxErrors: ptr(i.rxErrors), TxBytes: ptr(i.txBytes), TxErrors: ptr(i.txErrors)}
		if i.name == defaultInterface {
			n.InterfaceStats = s
		}
		n.Interfaces = append(n.Interfaces, s)
	}
	return n
}

func fsStats(t metav1.Time, fi fsInfo) *statsapi.FsStats {
	return &statsapi.FsStats{
		Time:           t,
		AvailableBytes: ptr(fi.available),
		CapacityBytes:  ptr(fi.capacity),
		UsedBytes:      ptr(fi.used),
		InodesFree:     ptr(fi.inodesFree),
		Inodes:         ptr(fi.inodes),
		InodesUsed:     ptr(fi.inodes - min(fi.inodesFree, fi.inodes)),
	}
}

// ImageFsStats is the runtime's image file system as the summary reports it
// (node.runtime.imageFs): used bytes from CRI ImageFsInfo, capacity and available
// bytes from statfs of its mount point. The image garbage collector compares its
// thresholds with it, as the kubelet's reads its stats provider's ImageFsStats.
func (p *Provider) ImageFsStats(ctx context.Context) (*statsapi.FsStats, error) {
	return p.imageFsStats(ctx)
}

// imageFsStats is the runtime's image file system: usage from ImageFsInfo,
// capacity from statfs of its mount point.
func (p *Provider) imageFsStats(ctx context.Context) (*statsapi.FsStats, error) {
	resp, err := p.cfg.Runtime.ImageFsInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("runtime image fs: %w", err)
	}
	fss := resp.GetImageFilesystems()
	if len(fss) == 0 {
		return nil, fmt.Errorf("runtime image fs: ImageFsInfo returned no file system")
	}
	u := fss[0]
	s := &statsapi.FsStats{Time: metav1.NewTime(time.Unix(0, u.GetTimestamp()))}
	if mp := u.GetFsId().GetMountpoint(); mp != "" {
		if fi, err := p.host.statfs(mp); err == nil {
			s = fsStats(s.Time, fi)
		}
	}
	if u.GetUsedBytes() != nil {
		s.UsedBytes = ptr(u.GetUsedBytes().GetValue())
	}
	if u.GetInodesUsed() != nil {
		s.InodesUsed = ptr(u.GetInodesUsed().GetValue())
	}
	return s, nil
}

// podStats lists the pods with their containers. Pod-level figures come from
// ListPodSandboxStats; when that fails, they are summed from the pod's containers,
// the fallback upstream's CRI stats provider takes on Unimplemented.
func (p *Provider) podStats(ctx context.Context, full, nodeSwap bool) ([]statsapi.PodStats, error) {
	sandboxes, err := p.cfg.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	containers, err := p.cfg.Runtime.ListContainers(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	cstats, err := p.cfg.Runtime.ListContainerStats(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list container stats: %w", err)
	}
	sbStats, err := p.cfg.Runtime.ListPodSandboxStats(ctx, nil)
	fromSandboxes := true
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("list pod sandbox stats: %w", err)
		}
		// Upstream falls back on Unimplemented only. containerd 1.6 implements the
		// call but fails it whole (Unknown, "cgroupPath is empty") as soon as one
		// sandbox has no cgroup parent, so any failure falls back here.
		level := 2
		if status.Code(err) == codes.Unimplemented {
			level = 4
		}
		logr.FromContextOrDiscard(ctx).V(level).Info("ListPodSandboxStats failed, summing container stats per pod", "err", err)
		fromSandboxes = false
	}

	var rootFs *fsInfo
	if full {
		fi, err := p.host.statfs(p.cfg.RootDir)
		if err != nil {
			return nil, err
		}
		rootFs = &fi
	}

	statsByID := make(map[string]*runtimeapi.ContainerStats, len(cstats))
	for _, s := range cstats {
		statsByID[s.GetAttributes().GetId()] = s
	}
	kept := latestSandboxes(sandboxes)
	byPod := map[string][]*runtimeapi.Container{}
	for _, c := range containers {
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		if _, ok := kept[c.GetPodSandboxId()]; ok {
			byPod[c.GetPodSandboxId()] = append(byPod[c.GetPodSandboxId()], c)
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	mountFs := map[string]*fsInfo{} // statfs of writable layers' mount points, once per scrape

	build := func(sb *runtimeapi.PodSandbox) statsapi.PodStats {
		labels, meta := sb.GetLabels(), sb.GetMetadata()
		ps := statsapi.PodStats{
			PodRef: statsapi.PodReference{
				Name:      cmp.Or(labels[cri.LabelPodName], meta.GetName()),
				Namespace: cmp.Or(labels[cri.LabelPodNamespace], meta.GetNamespace()),
				UID:       cmp.Or(labels[cri.LabelPodUID], meta.GetUid()),
			},
			StartTime:  metav1.NewTime(time.Unix(0, sb.GetCreatedAt())),
			Containers: []statsapi.ContainerStats{},
		}
		ctrs := byPod[sb.GetId()]
		sort.Slice(ctrs, func(i, j int) bool {
			return ctrs[i].GetMetadata().GetName() < ctrs[j].GetMetadata().GetName()
		})
		for _, c := range ctrs {
			seen[c.GetId()] = true
			cs := p.containerStats(c, statsByID[c.GetId()], nodeSwap)
			if full {
				cs.Rootfs = p.rootfsStats(statsByID[c.GetId()], mountFs)
				cs.Logs = p.logStats(ps.PodRef, cs.Name, *rootFs)
			}
			ps.Containers = append(ps.Containers, cs)
		}
		if full {
			// Files directly in the pod's log folder count too, as the kubelet's.
			podLogs, podLogFiles, _ := p.host.dirUsage(p.podLogDir(ps.PodRef))
			ps.EphemeralStorage = ephemeralStorage(ps.Containers, *rootFs, podLogs, podLogFiles)
		}
		return ps
	}

	var pods []statsapi.PodStats
	if fromSandboxes {
		for _, s := range sbStats {
			sb, ok := kept[s.GetAttributes().GetId()]
			if !ok {
				continue
			}
			ps := build(sb)
			p.addSandboxStats(&ps, s, full, seen)
			if ps.Swap == nil {
				// CRI has no pod-level swap.
				ps.Swap = sumSwap(ps.Containers)
			}
			pods = append(pods, ps)
		}
	} else {
		for id, sb := range kept {
			if len(byPod[id]) == 0 {
				continue
			}
			ps := build(sb)
			sumContainers(&ps)
			pods = append(pods, ps)
		}
	}
	for id := range p.cpuCache {
		if !seen[id] {
			delete(p.cpuCache, id)
		}
	}
	sort.Slice(pods, func(i, j int) bool {
		a, b := pods[i].PodRef, pods[j].PodRef
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	if pods == nil {
		pods = []statsapi.PodStats{}
	}
	return pods, nil
}

// latestSandboxes keeps, per pod UID, the ready sandboxes, or the newest one when
// none is ready: a pod whose sandbox was recreated is reported once.
func latestSandboxes(sandboxes []*runtimeapi.PodSandbox) map[string]*runtimeapi.PodSandbox {
	byUID := map[string][]*runtimeapi.PodSandbox{}
	for _, sb := range sandboxes {
		uid := sb.GetLabels()[cri.LabelPodUID]
		if uid == "" {
			uid = sb.GetMetadata().GetUid()
		}
		byUID[uid] = append(byUID[uid], sb)
	}
	kept := map[string]*runtimeapi.PodSandbox{}
	for _, sbs := range byUID {
		ready := false
		var newest *runtimeapi.PodSandbox
		for _, sb := range sbs {
			if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
				kept[sb.GetId()] = sb
				ready = true
			}
			if newest == nil || sb.GetCreatedAt() > newest.GetCreatedAt() {
				newest = sb
			}
		}
		if !ready {
			kept[newest.GetId()] = newest
		}
	}
	return kept
}

// containerStats converts the runtime's CPU, memory and swap figures. A container
// the runtime has no stats for reports zero usage now, as the kubelet's. Runtimes
// that report no swap (containerd 1.6) get zero swap when the node has none, which
// is then the truth, and none otherwise.
func (p *Provider) containerStats(c *runtimeapi.Container, s *runtimeapi.ContainerStats, nodeSwap bool) statsapi.ContainerStats {
	now := metav1.NewTime(p.cfg.Clock.Now())
	name := cmp.Or(c.GetLabels()[cri.LabelContainerName], c.GetMetadata().GetName())
	cs := statsapi.ContainerStats{
		Name:      name,
		StartTime: metav1.NewTime(time.Unix(0, c.GetCreatedAt())),
		CPU:       &statsapi.CPUStats{Time: now, UsageNanoCores: ptr(uint64(0)), UsageCoreNanoSeconds: ptr(uint64(0))},
		Memory:    &statsapi.MemoryStats{Time: now, WorkingSetBytes: ptr(uint64(0))},
	}
	if cpu := s.GetCpu(); cpu != nil {
		cs.CPU = p.cpuStats(c.GetId(), cpu)
	}
	if mem := s.GetMemory(); mem != nil {
		cs.Memory = memoryStats(mem)
	}
	if sw := s.GetSwap(); sw != nil {
		cs.Swap = swapStats(sw)
	} else if !nodeSwap {
		cs.Swap = &statsapi.SwapStats{Time: cs.Memory.Time, SwapUsageBytes: ptr(uint64(0))}
	}
	return cs
}

// cpuStats copies usage and derives usageNanoCores from the previous sample of the
// same container or sandbox when the runtime does not compute it. Callers hold mu.
func (p *Provider) cpuStats(id string, cpu *runtimeapi.CpuUsage) *statsapi.CPUStats {
	at := time.Unix(0, cpu.GetTimestamp())
	s := &statsapi.CPUStats{Time: metav1.NewTime(at)}
	if cpu.GetUsageCoreNanoSeconds() == nil {
		return s
	}
	usage := cpu.GetUsageCoreNanoSeconds().GetValue()
	s.UsageCoreNanoSeconds = ptr(usage)
	cur := cpuSample{at: at, usage: usage}
	if v := cpu.GetUsageNanoCores(); v != nil && v.GetValue() != 0 {
		s.UsageNanoCores = ptr(v.GetValue())
	} else {
		s.UsageNanoCores = usageNanoCores(p.cpuCache[id], cur)
	}
	if prev, ok := p.cpuCache[id]; !ok || at.After(prev.at) {
		p.cpuCache[id] = cur
	}
	return s
}

// usageNanoCores is the mean CPU rate between two samples, nil without a usable
// earlier sample.
func usageNanoCores(prev, cur cpuSample) *uint64 {
	if prev.at.IsZero() || !cur.at.After(prev.at) || cur.usage < prev.usage {
		return nil
	}
	d := cur.at.Sub(prev.at)
	return ptr(uint64(float64(cur.usage-prev.usage) / d.Seconds()))
}

func memoryStats(mem *runtimeapi.MemoryUsage) *statsapi.MemoryStats {
	m := &statsapi.MemoryStats{Time: metav1.NewTime(time.Unix(0, mem.GetTimestamp()))}
	m.WorkingSetBytes = value(mem.GetWorkingSetBytes())
	m.AvailableBytes = value(mem.GetAvailableBytes())
	m.UsageBytes = value(mem.GetUsageBytes())
	m.RSSBytes = value(mem.GetRssBytes())
	m.PageFaults = value(mem.GetPageFaults())
	m.MajorPageFaults = value(mem.GetMajorPageFaults())
	return m
}

func swapStats(sw *runtimeapi.SwapUsage) *statsapi.SwapStats {
	return &statsapi.SwapStats{
		Time:               metav1.NewTime(time.Unix(0, sw.GetTimestamp())),
		SwapAvailableBytes: value(sw.GetSwapAvailableBytes()),
		SwapUsageBytes:     value(sw.GetSwapUsageBytes()),
	}
}

// rootfsStats is the container's writable layer, with the capacity of the file
// system it lives on.
func (p *Provider) rootfsStats(s *runtimeapi.ContainerStats, mountFs map[string]*fsInfo) *statsapi.FsStats {
	wl := s.GetWritableLayer()
	if wl == nil {
		return nil
	}
	t := metav1.NewTime(time.Unix(0, wl.GetTimestamp()))
	fs := &statsapi.FsStats{Time: t}
	if mp := wl.GetFsId().GetMountpoint(); mp != "" {
		fi, ok := mountFs[mp]
		if !ok {
			if got, err := p.host.statfs(mp); err == nil {
				fi = &got
			}
			mountFs[mp] = fi
		}
		if fi != nil {
			fs.AvailableBytes = ptr(fi.available)
			fs.CapacityBytes = ptr(fi.capacity)
			fs.InodesFree = ptr(fi.inodesFree)
			fs.Inodes = ptr(fi.inodes)
		}
	}
	fs.UsedBytes = value(wl.GetUsedBytes())
	fs.InodesUsed = value(wl.GetInodesUsed())
	return fs
}

// logStats measures the files in the container's log folder under PodLogsDir;
// capacity is the root file system's, as the kubelet reports it. A missing folder
// gives no logs stats, an empty one no usage figures.
func (p *Provider) logStats(ref statsapi.PodReference, container string, rootFs fsInfo) *statsapi.FsStats {
	dir := filepath.Join(p.podLogDir(ref), container)
	used, files, err := p.host.dirUsage(dir)
	if err != nil {
		return nil
	}
	s := &statsapi.FsStats{
		Time:           metav1.NewTime(p.cfg.Clock.Now()),
		AvailableBytes: ptr(rootFs.available),
		CapacityBytes:  ptr(rootFs.capacity),
		InodesFree:     ptr(rootFs.inodesFree),
		Inodes:         ptr(rootFs.inodes),
	}
	if files > 0 {
		s.UsedBytes, s.InodesUsed = ptr(used), ptr(files)
	}
	return s
}

// podLogDir is the kubelet's <podLogsDir>/<namespace>_<name>_<uid>.
func (p *Provider) podLogDir(ref statsapi.PodReference) string {
	return filepath.Join(p.cfg.PodLogsDir, ref.Namespace+"_"+ref.Name+"_"+ref.UID)
}

// ephemeralStorage sums the containers' writable layers and logs and the pod's
// own log files.
func ephemeralStorage(containers []statsapi.ContainerStats, rootFs fsInfo, podLogs, podLogFiles uint64) *statsapi.FsStats {
	used, inodes := podLogs, podLogFiles
	var latest time.Time
	for _, c := range containers {
		for _, fs := range []*statsapi.FsStats{c.Rootfs, c.Logs} {
			if fs == nil {
				continue
			}
			used += deref(fs.UsedBytes)
			inodes += deref(fs.InodesUsed)
			if fs.Time.After(latest) {
				latest = fs.Time.Time
			}
		}
	}
	return &statsapi.FsStats{
		Time:           metav1.NewTime(latest),
		AvailableBytes: ptr(rootFs.available),
		CapacityBytes:  ptr(rootFs.capacity),
		InodesFree:     ptr(rootFs.inodesFree),
		Inodes:         ptr(rootFs.inodes),
		UsedBytes:      ptr(used),
		InodesUsed:     ptr(inodes),
	}
}

// addSandboxStats takes the pod's CPU, memory, network and process count
// from the runtime's sandbox stats. Callers hold mu.
func (p *Provider) addSandboxStats(ps *statsapi.PodStats, s *runtimeapi.PodSandboxStats, full bool, seen map[string]bool) {
	l := s.GetLinux()
	if l == nil {
		sumContainers(ps)
		return
	}
	id := s.GetAttributes().GetId()
	if cpu := l.GetCpu(); cpu != nil {
		seen[id] = true
		ps.CPU = p.cpuStats(id, cpu)
	}
	if mem := l.GetMemory(); mem != nil {
		ps.Memory = memoryStats(mem)
	}
	if !full {
		return
	}
	if n := l.GetNetwork(); n != nil {
		ns := &statsapi.NetworkStats{Time: metav1.NewTime(time.Unix(0, n.GetTimestamp()))}
		conv := func(i *runtimeapi.NetworkInterfaceUsage) statsapi.InterfaceStats {
			return statsapi.InterfaceStats{
				Name:     i.GetName(),
				RxBytes:  value(i.GetRxBytes()),
				RxErrors: value(i.GetRxErrors()),
				TxBytes:  value(i.GetTxBytes()),
				TxErrors: value(i.GetTxErrors()),
			}
		}
		if d := n.GetDefaultInterface(); d != nil {
			ns.InterfaceStats = conv(d)
		}
		for _, i := range n.GetInterfaces() {
			ns.Interfaces = append(ns.Interfaces, conv(i))
		}
		ps.Network = ns
	}
	if pr := l.GetProcess(); pr != nil && pr.GetProcessCount() != nil {
		ps.ProcessStats = &statsapi.ProcessStats{ProcessCount: ptr(pr.GetProcessCount().GetValue())}
	}
}

// sumContainers fills the pod's CPU, memory and swap with the sums of its
// containers', stamped with the latest container time.
func sumContainers(ps *statsapi.PodStats) {
	if len(ps.Containers) == 0 {
		return
	}
	cpu := &statsapi.CPUStats{}
	mem := &statsapi.MemoryStats{}
	// A rate is only meaningful when every container has one.
	rates := true
	for _, c := range ps.Containers {
		if c.CPU != nil {
			latestTime(&cpu.Time, c.CPU.Time)
			cpu.UsageCoreNanoSeconds = add(cpu.UsageCoreNanoSeconds, c.CPU.UsageCoreNanoSeconds)
			cpu.UsageNanoCores = add(cpu.UsageNanoCores, c.CPU.UsageNanoCores)
			rates = rates && c.CPU.UsageNanoCores != nil
		}
		if c.Memory != nil {
			latestTime(&mem.Time, c.Memory.Time)
			mem.WorkingSetBytes = add(mem.WorkingSetBytes, c.Memory.WorkingSetBytes)
			mem.UsageBytes = add(mem.UsageBytes, c.Memory.UsageBytes)
			mem.RSSBytes = add(mem.RSSBytes, c.Memory.RSSBytes)
			mem.PageFaults = add(mem.PageFaults, c.Memory.PageFaults)
			mem.MajorPageFaults = add(mem.MajorPageFaults, c.Memory.MajorPageFaults)
		}
	}
	if !rates {
		cpu.UsageNanoCores = nil
	}
	ps.CPU, ps.Memory, ps.Swap = cpu, mem, sumSwap(ps.Containers)
}

// sumSwap sums the containers' swap usage, nil when none reports swap.
func sumSwap(containers []statsapi.ContainerStats) *statsapi.SwapStats {
	var swap *statsapi.SwapStats
	for _, c := range containers {
		if c.Swap == nil {
			continue
		}
		if swap == nil {
			swap = &statsapi.SwapStats{}
		}
		latestTime(&swap.Time, c.Swap.Time)
		swap.SwapUsageBytes = add(swap.SwapUsageBytes, c.Swap.SwapUsageBytes)
	}
	return swap
}

func latestTime(dst *metav1.Time, t metav1.Time) {
	if t.After(dst.Time) {
		*dst = t
	}
}

// add sums optional figures: nil only when both are nil.
func add(a, b *uint64) *uint64 {
	if a == nil && b == nil {
		return nil
	}
	return ptr(deref(a) + deref(b))
}

func ptr[T any](v T) *T { return &v }

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

func value(v *runtimeapi.UInt64Value) *uint64 {
	if v == nil {
		return nil
	}
	return ptr(v.GetValue())
}
