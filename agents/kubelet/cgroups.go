package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/nodekit-dev/nodekit/podsync"
)

// The kubelet's CFS conversions (pkg/kubelet/cm/helpers_linux.go).
const (
	minShares      = 2
	maxShares      = 262144
	sharesPerCPU   = 1024
	milliCPUToCPU  = 1000
	quotaPeriod    = 100000 // µs: 100 ms
	minQuotaPeriod = 1000   // µs: 1 ms
)

// Names in the cgroup tree, as the kubelet's cgroupfs driver lays it out:
// <cgroupRoot>/kubepods/{burstable,besteffort}/pod<uid>; Guaranteed pods sit
// directly under kubepods.
const (
	kubepodsName   = "kubepods"
	burstableName  = "burstable"
	besteffortName = "besteffort"
	podCgroupPref  = "pod"
	cgroupfsMounts = "/sys/fs/cgroup"
	// qosUpdatePeriod is how often the QoS cgroups are recomputed (the kubelet's
	// periodicQOSCgroupUpdateInterval).
	qosUpdatePeriod = time.Minute
)

// v1Required are the cgroup v1 controllers the kubelet checks the root against
// (its cgroupfs manager's whitelist), when mounted.
var v1Required = []string{"cpu", "cpuacct", "cpuset", "memory", "pids"}

// milliCPUToShares is the kubelet's MilliCPUToShares: 1024 shares per CPU, at
// least 2 (the kernel's minimum, also for no request) and at most 262144.
func milliCPUToShares(milliCPU int64) uint64 {
	if milliCPU == 0 {
		return minShares
	}
	shares := milliCPU * sharesPerCPU / milliCPUToCPU
	switch {
	case shares < minShares:
		return minShares
	case shares > maxShares:
		return maxShares
	}
	return uint64(shares)
}

// milliCPUToQuota is the kubelet's MilliCPUToQuota: the CFS quota for a CPU limit
// over period (µs), at least 1 ms; 0 for no limit.
func milliCPUToQuota(milliCPU int64, period int64) int64 {
	if milliCPU == 0 {
		return 0
	}
	quota := milliCPU * period / milliCPUToCPU
	if quota < minQuotaPeriod {
		quota = minQuotaPeriod
	}
	return quota
}

// resourceConfig is what the kubelet writes into a pod or QoS cgroup; nil fields
// are left as the kernel has them.
type resourceConfig struct {
	CPUShares *uint64
	CPUQuota  *int64
	CPUPeriod *uint64
	Memory    *int64
	PidsLimit *int64
}

// podQOS is the pod's QoS class as the kubelet reads it: status.qosClass once
// the API server set it, computed otherwise.
func podQOS(pod *corev1.Pod) corev1.PodQOSClass {
	if pod.Status.QOSClass != "" {
		return pod.Status.QOSClass
	}
	return podsync.QOSClass(pod)
}

// resourceConfigForPod is the pod cgroup's configuration as the kubelet's
// ResourceConfigForPod computes it: shares from the pod's cpu request; for
// Guaranteed pods the cpu quota and memory limit from its limits; for Burstable
// pods the same, each only when every container declares that limit (or the pod
// declares it at pod level); BestEffort pods get 2 shares and nothing else.
// enforceCPULimits false (cpuCFSQuota: false) writes quota -1 (unlimited).
func resourceConfigForPod(pod *corev1.Pod, enforceCPULimits bool, period uint64) resourceConfig {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	limits := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{})
	cpuDeclared, memDeclared := true, true
	all := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	for i := range all {
		if all[i].Resources.Limits.Cpu().IsZero() {
			cpuDeclared = false
		}
		if all[i].Resources.Limits.Memory().IsZero() {
			memDeclared = false
		}
	}
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		// A pod-level limit counts only when non-zero, as in the kubelet's
		// ResourceConfigForPod (v1.37.2 pkg/kubelet/cm/helpers_linux.go).
		if !pod.Spec.Resources.Limits.Cpu().IsZero() {
			cpuDeclared = true
		}
		if !pod.Spec.Resources.Limits.Memory().IsZero() {
			memDeclared = true
		}
	}
	var cpuReq, cpuLim, memLim int64
	if q, ok := reqs[corev1.ResourceCPU]; ok {
		cpuReq = q.MilliValue()
	}
	if q, ok := limits[corev1.ResourceCPU]; ok {
		cpuLim = q.MilliValue()
	}
	if q, ok := limits[corev1.ResourceMemory]; ok {
		memLim = q.Value()
	}
	shares := milliCPUToShares(cpuReq)
	quota := milliCPUToQuota(cpuLim, int64(period))
	if !enforceCPULimits {
		quota = -1
	}
	var out resourceConfig
	switch podQOS(pod) {
	case corev1.PodQOSGuaranteed:
		out.CPUShares, out.CPUQuota, out.CPUPeriod, out.Memory = &shares, &quota, &period, &memLim
	case corev1.PodQOSBurstable:
		out.CPUShares = &shares
		if cpuDeclared {
			out.CPUQuota, out.CPUPeriod = &quota, &period
		}
		if memDeclared {
			out.Memory = &memLim
		}
	default:
		s := uint64(minShares)
		out.CPUShares = &s
	}
	return out
}

// burstableShares is the burstable QoS cgroup's cpu.shares: the sum of the cpu
// requests of the node's Burstable pods (the kubelet's setCPUCgroupConfig).
func burstableShares(pods []*corev1.Pod) uint64 {
	var milli int64
	for _, p := range pods {
		if podQOS(p) != corev1.PodQOSBurstable {
			continue
		}
		if q, ok := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})[corev1.ResourceCPU]; ok {
			milli += q.MilliValue()
		}
	}
	return milliCPUToShares(milli)
}

// podCgroups manages the kubelet's cgroup tree with the cgroupfs driver: the
// node allocatable cgroup (kubepods), its QoS children and one cgroup per pod,
// through opencontainers/cgroups (the library runc and the kubelet use) on cgroup
// v1 or v2.
type podCgroups struct {
	// root is the cgroupfs name pods go under: cgroupRoot/kubepods with
	// cgroupsPerQOS, cgroupRoot without.
	root         string
	perQOS       bool
	enforceCPU   bool
	period       uint64
	podPidsLimit int64
	v2           bool
	mountRoot    string

	mu sync.Mutex
}

// newPodCgroups checks the configuration as the kubelet's container manager does
// at start: cgroupRoot (default "/") must exist in every controller used.
func newPodCgroups(cfg *kubeletv1beta1.KubeletConfiguration) (*podCgroups, error) {
	root := cfg.CgroupRoot
	if root == "" {
		root = "/"
		if *cfg.CgroupsPerQOS {
			klog.InfoS("--cgroups-per-qos enabled, but --cgroup-root was not specified.  defaulting to /")
		}
	}
	if !strings.HasPrefix(root, "/") {
		return nil, fmt.Errorf("%w: cgroupRoot %q must be an absolute cgroupfs path", ErrInvalidConfig, cfg.CgroupRoot)
	}
	root = path.Clean(root)
	c := &podCgroups{
		root: root, perQOS: *cfg.CgroupsPerQOS, enforceCPU: *cfg.CPUCFSQuota,
		period:       uint64(cfg.CPUCFSQuotaPeriod.Duration / time.Microsecond),
		podPidsLimit: *cfg.PodPidsLimit, v2: cgroups.IsCgroup2UnifiedMode(), mountRoot: cgroupfsMounts,
	}
	if c.period == 0 {
		c.period = quotaPeriod
	}
	if missing := c.missingPaths(root); len(missing) > 0 {
		return nil, fmt.Errorf("%w: cgroupRoot: cgroup %q has some missing paths: %s", ErrInvalidConfig, root, strings.Join(missing, ", "))
	}
	if c.perQOS {
		c.root = path.Join(root, kubepodsName)
	}
	return c, nil
}

// missingPaths lists the controller folders of cgroup name that do not exist.
func (c *podCgroups) missingPaths(name string) []string {
	var missing []string
	if c.v2 {
		p := filepath.Join(c.mountRoot, name)
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
		return missing
	}
	for _, ctrl := range v1Required {
		mount := filepath.Join(c.mountRoot, ctrl)
		if _, err := os.Stat(mount); err != nil {
			continue // controller not mounted on this machine
		}
		if p := filepath.Join(mount, name); !dirExists(p) {
			missing = append(missing, p)
		}
	}
	return missing
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// exists reports whether cgroup name exists in every controller used.
func (c *podCgroups) exists(name string) bool { return len(c.missingPaths(name)) == 0 }

func (c *podCgroups) manager(name string, res resourceConfig) (cgroups.Manager, error) {
	cg := &cgroups.Cgroup{Path: name, Resources: resourcesOf(res)}
	if c.v2 {
		return fs2.NewManager(cg, filepath.Join(c.mountRoot, name))
	}
	return fs.NewManager(cg, nil)
}

// apply creates cgroup name (when missing) and writes res into it.
func (c *podCgroups) apply(name string, res resourceConfig) error {
	m, err := c.manager(name, res)
	if err != nil {
		return err
	}
	if err := m.Apply(-1); err != nil {
		return fmt.Errorf("create cgroup %s: %w", name, err)
	}
	if err := m.Set(resourcesOf(res)); err != nil {
		return fmt.Errorf("configure cgroup %s: %w", name, err)
	}
	return nil
}

func resourcesOf(res resourceConfig) *cgroups.Resources {
	r := &cgroups.Resources{SkipDevices: true, PidsLimit: res.PidsLimit}
	if res.CPUShares != nil {
		r.CpuShares = *res.CPUShares
	}
	if res.CPUQuota != nil {
		r.CpuQuota = *res.CPUQuota
	}
	if res.CPUPeriod != nil {
		r.CpuPeriod = *res.CPUPeriod
	}
	if res.Memory != nil {
		r.Memory = *res.Memory
	}
	return r
}

// nodeAllocatableConfig is the kubepods cgroup's configuration (the kubelet's
// getCgroupConfig): cpu.shares for the cpu, the memory limit and the pids limit
// of allocatable.
func nodeAllocatableConfig(allocatable corev1.ResourceList) resourceConfig {
	var out resourceConfig
	if q, ok := allocatable[corev1.ResourceCPU]; ok {
		s := milliCPUToShares(q.MilliValue())
		out.CPUShares = &s
	}
	if q, ok := allocatable[corev1.ResourceMemory]; ok {
		v := q.Value()
		out.Memory = &v
	}
	if q, ok := allocatable[pidResource]; ok {
		v := q.Value()
		out.PidsLimit = &v
	}
	return out
}

// pidResource is the kubelet's internal process-ID resource (capacity
// /proc/sys/kernel/pid_max), reservable through systemReserved/kubeReserved "pid".
const pidResource corev1.ResourceName = "pid"

// start lays out the QoS hierarchy as the kubelet's container manager does at
// start: kubepods with the node allocatable limits (capacity minus kubeReserved
// and systemReserved when enforceNodeAllocatable has "pods", the default), then
// kubepods/burstable and kubepods/besteffort (2 shares). Without cgroupsPerQOS it
// does nothing.
func (c *podCgroups) start(allocatable corev1.ResourceList, pods []*corev1.Pod) error {
	if !c.perQOS {
		return nil
	}
	if err := c.apply(c.root, nodeAllocatableConfig(allocatable)); err != nil {
		return err
	}
	return c.updateQOS(pods)
}

// updateQOS (re)writes the QoS cgroups: besteffort 2 shares, burstable the sum of
// the Burstable pods' cpu requests (the kubelet's UpdateCgroups).
func (c *podCgroups) updateQOS(pods []*corev1.Pod) error {
	if !c.perQOS {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	be := uint64(minShares)
	if err := c.apply(path.Join(c.root, besteffortName), resourceConfig{CPUShares: &be}); err != nil {
		return err
	}
	bu := burstableShares(pods)
	return c.apply(path.Join(c.root, burstableName), resourceConfig{CPUShares: &bu})
}

// podName is the pod's cgroup (cgroupfs name), the sandbox's CgroupParent; without
// cgroupsPerQOS, the cgroup root itself, as the kubelet's no-op pod manager.
func (c *podCgroups) podName(pod *corev1.Pod) string {
	if !c.perQOS {
		return c.root
	}
	return c.podNameFor(podQOS(pod), pod.UID)
}

func (c *podCgroups) podNameFor(qos corev1.PodQOSClass, uid types.UID) string {
	switch qos {
	case corev1.PodQOSGuaranteed:
		return path.Join(c.root, podCgroupPref+string(uid))
	case corev1.PodQOSBurstable:
		return path.Join(c.root, burstableName, podCgroupPref+string(uid))
	}
	return path.Join(c.root, besteffortName, podCgroupPref+string(uid))
}

// ensurePod creates the pod's cgroup with resourceConfigForPod (plus podPidsLimit)
// when it does not exist yet, first updating the QoS cgroups for pods (the node's
// active pods, this one included), as the kubelet's SyncPod does.
func (c *podCgroups) ensurePod(pod *corev1.Pod, pods []*corev1.Pod) error {
	if !c.perQOS {
		return nil
	}
	name := c.podName(pod)
	if c.exists(name) {
		return nil
	}
	if err := c.updateQOS(pods); err != nil {
		klog.V(2).InfoS("Failed to update QoS cgroups while syncing pod", "pod", klog.KObj(pod), "err", err)
	}
	res := resourceConfigForPod(pod, c.enforceCPU, c.period)
	if c.podPidsLimit > 0 {
		l := c.podPidsLimit
		res.PidsLimit = &l
	}
	if err := c.apply(name, res); err != nil {
		return fmt.Errorf("failed to create container for %s : %w", name, err)
	}
	return nil
}

// podCgroupsOnNode lists the pod cgroups that exist, by pod UID.
func (c *podCgroups) podCgroupsOnNode() map[types.UID]string {
	out := map[types.UID]string{}
	if !c.perQOS {
		return out
	}
	base := c.mountRoot
	if !c.v2 {
		base = filepath.Join(c.mountRoot, "cpu")
	}
	for _, qos := range []string{"", burstableName, besteffortName} {
		dir := path.Join(c.root, qos)
		entries, err := os.ReadDir(filepath.Join(base, dir))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), podCgroupPref) {
				out[types.UID(strings.TrimPrefix(e.Name(), podCgroupPref))] = path.Join(dir, e.Name())
			}
		}
	}
	return out
}

// removePod kills what still runs in the pod's cgroup and removes it, in every
// controller (the kubelet's pod container manager Destroy). A pod without a
// cgroup is not an error.
func (c *podCgroups) removePod(uid types.UID) error {
	if !c.perQOS {
		return nil
	}
	var errs []error
	for _, qos := range []corev1.PodQOSClass{corev1.PodQOSGuaranteed, corev1.PodQOSBurstable, corev1.PodQOSBestEffort} {
		name := c.podNameFor(qos, uid)
		if len(c.missingPaths(name)) == len(c.controllerPaths(name)) {
			continue // not there in any controller
		}
		if err := c.destroy(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// controllerPaths are the folders of cgroup name, one per controller used.
func (c *podCgroups) controllerPaths(name string) []string {
	if c.v2 {
		return []string{filepath.Join(c.mountRoot, name)}
	}
	var out []string
	for _, ctrl := range v1Required {
		mount := filepath.Join(c.mountRoot, ctrl)
		if _, err := os.Stat(mount); err == nil {
			out = append(out, filepath.Join(mount, name))
		}
	}
	return out
}

func (c *podCgroups) destroy(name string) error {
	m, err := c.manager(name, resourceConfig{})
	if err != nil {
		return err
	}
	// Processes left behind (a container the runtime lost) keep the folder busy:
	// kill them first, a few rounds, as the kubelet does.
	for range 5 {
		pids := c.pids(name)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := m.Destroy(); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", name, err)
	}
	return nil
}

func (c *podCgroups) pids(name string) []int {
	var out []int
	for _, p := range c.controllerPaths(name) {
		if list, err := cgroups.GetAllPids(p); err == nil {
			out = append(out, list...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// cgroupAllocatable is the node's allocatable as the kubelet's container manager
// enforces it on kubepods (getNodeAllocatableInternalAbsolute): cpu, memory and
// process IDs of the machine, minus kubeReserved and systemReserved (the eviction
// thresholds stay out, unlike the allocatable in node status).
func cgroupAllocatable(n *nodeStatus) corev1.ResourceList {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(n.machine.numCPU())*1000, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(n.machine.meminfo()["MemTotal"], resource.BinarySI),
	}
	if pidMax, err := strconv.ParseInt(n.machine.read("proc/sys/kernel/pid_max"), 10, 64); err == nil {
		capacity[pidResource] = *resource.NewQuantity(pidMax, resource.DecimalSI)
	}
	enforce := n.cfg.EnforceNodeAllocatable
	if enforce == nil {
		enforce = []string{"pods"}
	}
	if !slices.Contains(enforce, "pods") {
		return capacity
	}
	out := corev1.ResourceList{}
	for k, v := range capacity {
		value := v.DeepCopy()
		for _, reserved := range []map[string]string{n.cfg.KubeReserved, n.cfg.SystemReserved} {
			if r, ok := reserved[string(k)]; ok {
				if q, err := resource.ParseQuantity(r); err == nil {
					value.Sub(q)
				}
			}
		}
		if value.Sign() < 0 {
			value.Set(0)
		}
		out[k] = value
	}
	return out
}
