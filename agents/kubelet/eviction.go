package main

// Node-pressure eviction, after pkg/kubelet/eviction of the v1.37.2 kubelet: the
// thresholds of evictionHard and evictionSoft, the signals observed from the stats
// summary, the pressure conditions, the ranking of pods and the messages. This file
// holds the decisions, as functions of their inputs and an explicit time, so unit
// tests drive them with fake stats; eviction_manager.go runs them every
// monitoring interval against the node.

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/staticpod"
)

// evictionSignal names what a threshold watches, with the kubelet's names.
type evictionSignal string

const (
	signalMemoryAvailable            evictionSignal = "memory.available"
	signalAllocatableMemoryAvailable evictionSignal = "allocatableMemory.available"
	signalNodeFsAvailable            evictionSignal = "nodefs.available"
	signalNodeFsInodesFree           evictionSignal = "nodefs.inodesFree"
	signalImageFsAvailable           evictionSignal = "imagefs.available"
	signalImageFsInodesFree          evictionSignal = "imagefs.inodesFree"
	signalContainerFsAvailable       evictionSignal = "containerfs.available"
	signalContainerFsInodesFree      evictionSignal = "containerfs.inodesFree"
	signalPIDAvailable               evictionSignal = "pid.available"
)

// The kubelet's reason and messages (pkg/kubelet/eviction/helpers.go).
const (
	evictionReason                  = "Evicted"
	nodeLowMessageFmt               = "The node was low on resource: %v. "
	nodeConditionMessageFmt         = "The node had condition: %v. "
	thresholdMetMessageFmt          = "Threshold quantity: %v, available: %v. "
	containerMessageFmt             = "Container %s was using %s, request is %s, has larger consumption of %v. "
	podMessageFmt                   = "Pod %s was using %s, request is %s, has larger consumption of %v. "
	containerEphemeralStorageMsgFmt = "Container %s exceeded its local ephemeral storage limit %q. "
	podEphemeralStorageMessageFmt   = "Pod ephemeral local storage usage exceeds the total limit of containers %s. "
	emptyDirMessageFmt              = "Usage of EmptyDir volume %q exceeds the limit %q. "

	// Signals of the local storage limit evictions, as the kubelet_evictions
	// metric labels them.
	signalEphemeralContainerFsLimit = "ephemeralcontainerfs.limit"
	signalEphemeralPodFsLimit       = "ephemeralpodfs.limit"
	signalEmptyDirFsLimit           = "emptydirfs.limit"

	// immediateEvictionGracePeriodSeconds is the grace a pod gets when a hard
	// threshold or a local storage limit evicts it.
	immediateEvictionGracePeriodSeconds = 1

	// systemCriticalPriority is scheduling.SystemCriticalPriority: pods at or above
	// it are never evicted.
	systemCriticalPriority = 2 * 1000000000

	resourceInodes corev1.ResourceName = "inodes"
	resourcePIDs   corev1.ResourceName = "pids"
)

// signalToCondition and signalToResource are the kubelet's maps; a signal missing
// from signalToResource is not a valid eviction signal.
var (
	signalToCondition = map[evictionSignal]corev1.NodeConditionType{
		signalMemoryAvailable:            corev1.NodeMemoryPressure,
		signalAllocatableMemoryAvailable: corev1.NodeMemoryPressure,
		signalNodeFsAvailable:            corev1.NodeDiskPressure,
		signalNodeFsInodesFree:           corev1.NodeDiskPressure,
		signalImageFsAvailable:           corev1.NodeDiskPressure,
		signalImageFsInodesFree:          corev1.NodeDiskPressure,
		signalContainerFsAvailable:       corev1.NodeDiskPressure,
		signalContainerFsInodesFree:      corev1.NodeDiskPressure,
		signalPIDAvailable:               corev1.NodePIDPressure,
	}
	signalToResource = map[evictionSignal]corev1.ResourceName{
		signalMemoryAvailable:            corev1.ResourceMemory,
		signalAllocatableMemoryAvailable: corev1.ResourceMemory,
		signalNodeFsAvailable:            corev1.ResourceEphemeralStorage,
		signalNodeFsInodesFree:           resourceInodes,
		signalImageFsAvailable:           corev1.ResourceEphemeralStorage,
		signalImageFsInodesFree:          resourceInodes,
		signalContainerFsAvailable:       corev1.ResourceEphemeralStorage,
		signalContainerFsInodesFree:      resourceInodes,
		signalPIDAvailable:               resourcePIDs,
	}
)

// thresholdValue is an absolute quantity or a fraction of the signal's capacity.
type thresholdValue struct {
	quantity *resource.Quantity
	// percentage is a fraction (0.1 for 10%) in float32, as upstream keeps it, so
	// a percentage gives the same bytes as the kubelet's.
	percentage float32
}

// of is the value in absolute units against a capacity.
func (v thresholdValue) of(capacity *resource.Quantity) *resource.Quantity {
	if v.quantity != nil {
		q := v.quantity.DeepCopy()
		return &q
	}
	return resource.NewQuantity(int64(float64(capacity.Value())*float64(v.percentage)), resource.BinarySI)
}

func (v thresholdValue) String() string {
	if v.quantity != nil {
		return v.quantity.String()
	}
	return strconv.FormatFloat(float64(v.percentage)*100, 'g', 6, 64) + "%"
}

// evictionThreshold is one threshold: the signal is met when what is available
// drops below value. A zero gracePeriod makes it hard.
type evictionThreshold struct {
	signal      evictionSignal
	value       thresholdValue
	gracePeriod time.Duration
	minReclaim  *thresholdValue
}

func (t evictionThreshold) hard() bool { return t.gracePeriod == 0 }

// key identifies a threshold across monitoring rounds.
func (t evictionThreshold) key() string {
	return fmt.Sprintf("%s<%s/%s", t.signal, t.value, t.gracePeriod)
}

// evictionConfig is what the manager enforces, parsed from the KubeletConfiguration.
type evictionConfig struct {
	thresholds []evictionThreshold
	// pressureTransitionPeriod is how long a pressure condition stays after its
	// threshold was last met (evictionPressureTransitionPeriod).
	pressureTransitionPeriod time.Duration
	// maxPodGracePeriod caps a pod's grace when a soft threshold evicts it.
	maxPodGracePeriod int64
	// localStorage enables the emptyDir and ephemeral-storage limit evictions
	// (localStorageCapacityIsolation).
	localStorage bool
}

// parseEvictionConfig parses the thresholds as the kubelet's ParseThresholdConfig
// does: hard ones, soft ones (each needing a grace period), minimum reclaims, and
// an allocatableMemory.available copy of a hard memory.available when
// enforceNodeAllocatable has "pods". Errors name the field at fault.
func parseEvictionConfig(hard, soft, softGrace, minReclaim map[string]string, enforceNodeAllocatable []string) ([]evictionThreshold, error) {
	hardT, err := parseThresholdStatements("evictionHard", hard)
	if err != nil {
		return nil, err
	}
	softT, err := parseThresholdStatements("evictionSoft", soft)
	if err != nil {
		return nil, err
	}
	graces := map[evictionSignal]time.Duration{}
	for _, k := range sortedKeys(softGrace) {
		if !validSignal(evictionSignal(k)) {
			return nil, fmt.Errorf("evictionSoftGracePeriod[%q]: unsupported eviction signal %v", k, k)
		}
		d, err := time.ParseDuration(softGrace[k])
		if err != nil {
			return nil, fmt.Errorf("evictionSoftGracePeriod[%q]: %w", k, err)
		}
		if d < 0 {
			return nil, fmt.Errorf("evictionSoftGracePeriod[%q]: invalid eviction grace period specified: %v, must be a positive value", k, softGrace[k])
		}
		graces[evictionSignal(k)] = d
	}
	reclaims := map[evictionSignal]thresholdValue{}
	for _, k := range sortedKeys(minReclaim) {
		if !validSignal(evictionSignal(k)) {
			return nil, fmt.Errorf("evictionMinimumReclaim[%q]: unsupported eviction signal %v", k, k)
		}
		v := minReclaim[k]
		if p, ok := strings.CutSuffix(v, "%"); ok {
			f, err := strconv.ParseFloat(p, 32)
			if err != nil || f <= 0 {
				return nil, fmt.Errorf("evictionMinimumReclaim[%q]: eviction percentage minimum reclaim %v must be positive: %s", k, k, v)
			}
			reclaims[evictionSignal(k)] = thresholdValue{percentage: float32(f) / 100}
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("evictionMinimumReclaim[%q]: %w", k, err)
		}
		if q.Sign() < 0 {
			return nil, fmt.Errorf("evictionMinimumReclaim[%q]: negative eviction minimum reclaim specified for %v", k, k)
		}
		reclaims[evictionSignal(k)] = thresholdValue{quantity: &q}
	}
	for i := range softT {
		d, ok := graces[softT[i].signal]
		if !ok {
			return nil, fmt.Errorf("evictionSoft[%q]: grace period must be specified for the soft eviction threshold %v (evictionSoftGracePeriod)", softT[i].signal, softT[i].signal)
		}
		softT[i].gracePeriod = d
	}
	out := append(hardT, softT...)
	for i := range out {
		if r, ok := reclaims[out[i].signal]; ok {
			out[i].minReclaim = &r
		}
	}
	for _, k := range enforceNodeAllocatable {
		if k != "pods" {
			continue
		}
		var extra []evictionThreshold
		for _, t := range out {
			if t.signal == signalMemoryAvailable && t.hard() {
				extra = append(extra, evictionThreshold{signal: signalAllocatableMemoryAvailable, value: t.value, minReclaim: t.minReclaim})
			}
		}
		out = append(out, extra...)
		break
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func validSignal(s evictionSignal) bool {
	_, ok := signalToResource[s]
	return ok
}

// parseThresholdStatements parses one map of thresholds in a stable order; 0% and
// 100% are ignored as upstream ignores them.
func parseThresholdStatements(field string, statements map[string]string) ([]evictionThreshold, error) {
	var out []evictionThreshold
	for _, k := range sortedKeys(statements) {
		t, err := parseThresholdStatement(evictionSignal(k), statements[k])
		if err != nil {
			return nil, fmt.Errorf("%s[%q]: %w", field, k, err)
		}
		if t != nil {
			out = append(out, *t)
		}
	}
	return out, nil
}

func parseThresholdStatement(signal evictionSignal, val string) (*evictionThreshold, error) {
	if !validSignal(signal) {
		return nil, fmt.Errorf("unsupported eviction signal %v", signal)
	}
	if p, ok := strings.CutSuffix(val, "%"); ok {
		if val == "0%" || val == "100%" {
			return nil, nil
		}
		f, err := strconv.ParseFloat(p, 32)
		if err != nil {
			return nil, fmt.Errorf("invalid percentage %q: %w", val, err)
		}
		if f < 0 {
			return nil, fmt.Errorf("eviction percentage threshold %v must be >= 0%%: %s", signal, val)
		}
		if f > 100 {
			return nil, fmt.Errorf("eviction percentage threshold %v must be <= 100%%: %s", signal, val)
		}
		return &evictionThreshold{signal: signal, value: thresholdValue{percentage: float32(f) / 100}}, nil
	}
	q, err := resource.ParseQuantity(val)
	if err != nil {
		return nil, fmt.Errorf("invalid quantity %q: %w", val, err)
	}
	if q.Sign() <= 0 {
		return nil, fmt.Errorf("eviction threshold %v must be positive: %s", signal, &q)
	}
	return &evictionThreshold{signal: signal, value: thresholdValue{quantity: &q}}, nil
}

// withContainerFsThresholds is the kubelet's UpdateContainerFsThresholds for the
// layouts nodekit's kubelet meets (no separate container file system): thresholds
// set for containerfs are dropped, and containerfs gets nodefs's thresholds on a
// single file system, imagefs's with a dedicated image file system.
func withContainerFsThresholds(thresholds []evictionThreshold, dedicatedImageFs bool) []evictionThreshold {
	from := map[evictionSignal]evictionSignal{
		signalContainerFsAvailable: signalNodeFsAvailable, signalContainerFsInodesFree: signalNodeFsInodesFree,
	}
	if dedicatedImageFs {
		from = map[evictionSignal]evictionSignal{
			signalContainerFsAvailable: signalImageFsAvailable, signalContainerFsInodesFree: signalImageFsInodesFree,
		}
	}
	var out, copies []evictionThreshold
	for _, t := range thresholds {
		if t.signal == signalContainerFsAvailable || t.signal == signalContainerFsInodesFree {
			klog.InfoS("Eviction manager: containerfs thresholds follow the node's file systems; ignoring the one configured", "signal", t.signal)
			continue
		}
		out = append(out, t)
		for to, src := range from {
			if t.signal == src {
				c := t
				c.signal = to
				copies = append(copies, c)
			}
		}
	}
	return append(out, copies...)
}

// signalObservation is what is available of a signal's resource, out of what
// capacity, as read at time.
type signalObservation struct {
	available *resource.Quantity
	capacity  *resource.Quantity
	time      time.Time
}

type signalObservations map[evictionSignal]signalObservation

// makeObservations derives the signals from a stats summary, as the kubelet's
// makeSignalObservations does: memory.available from the node's available bytes
// (capacity = available + working set), allocatableMemory.available from the
// pods' cgroup (the "pods" system container), the node and image file systems,
// and pid.available from the rlimit figures. Without a dedicated image file
// system the containerfs signals read the node file system.
func makeObservations(s *statsapi.Summary) signalObservations {
	out := signalObservations{}
	n := s.Node
	memObs := func(m *statsapi.MemoryStats) (signalObservation, bool) {
		if m == nil || m.AvailableBytes == nil || m.WorkingSetBytes == nil {
			return signalObservation{}, false
		}
		return signalObservation{
			available: resource.NewQuantity(int64(*m.AvailableBytes), resource.BinarySI),
			capacity:  resource.NewQuantity(int64(*m.AvailableBytes+*m.WorkingSetBytes), resource.BinarySI),
			time:      m.Time.Time,
		}, true
	}
	if o, ok := memObs(n.Memory); ok {
		out[signalMemoryAvailable] = o
	}
	for _, c := range n.SystemContainers {
		if c.Name == statsapi.SystemContainerPods {
			if o, ok := memObs(c.Memory); ok {
				out[signalAllocatableMemoryAvailable] = o
			}
		}
	}
	fsObs := func(fs *statsapi.FsStats, bytes, inodes evictionSignal) {
		if fs == nil {
			return
		}
		if fs.AvailableBytes != nil && fs.CapacityBytes != nil {
			out[bytes] = signalObservation{
				available: resource.NewQuantity(int64(*fs.AvailableBytes), resource.BinarySI),
				capacity:  resource.NewQuantity(int64(*fs.CapacityBytes), resource.BinarySI),
				time:      fs.Time.Time,
			}
		}
		if fs.InodesFree != nil && fs.Inodes != nil {
			out[inodes] = signalObservation{
				available: resource.NewQuantity(int64(*fs.InodesFree), resource.DecimalSI),
				capacity:  resource.NewQuantity(int64(*fs.Inodes), resource.DecimalSI),
				time:      fs.Time.Time,
			}
		}
	}
	fsObs(n.Fs, signalNodeFsAvailable, signalNodeFsInodesFree)
	if n.Runtime != nil {
		fsObs(n.Runtime.ImageFs, signalImageFsAvailable, signalImageFsInodesFree)
		fsObs(n.Runtime.ContainerFs, signalContainerFsAvailable, signalContainerFsInodesFree)
	}
	if r := n.Rlimit; r != nil && r.NumOfRunningProcesses != nil && r.MaxPID != nil {
		out[signalPIDAvailable] = signalObservation{
			available: resource.NewQuantity(*r.MaxPID-*r.NumOfRunningProcesses, resource.DecimalSI),
			capacity:  resource.NewQuantity(*r.MaxPID, resource.DecimalSI),
			time:      r.Time.Time,
		}
	}
	return out
}

// thresholdsMet returns the thresholds whose signal is below their value; with
// enforceMinReclaim, below value + minReclaim (so a met threshold stays met until
// the minimum reclaim is reached).
func thresholdsMet(thresholds []evictionThreshold, obs signalObservations, enforceMinReclaim bool) []evictionThreshold {
	var out []evictionThreshold
	for _, t := range thresholds {
		o, ok := obs[t.signal]
		if !ok {
			continue
		}
		q := t.value.of(o.capacity)
		if enforceMinReclaim && t.minReclaim != nil {
			q.Add(*t.minReclaim.of(o.capacity))
		}
		if q.Cmp(*o.available) > 0 {
			out = append(out, t)
		}
	}
	return out
}

func mergeThresholds(a, b []evictionThreshold) []evictionThreshold {
	out := append([]evictionThreshold(nil), a...)
	for _, t := range b {
		found := false
		for _, have := range out {
			if have.key() == t.key() {
				found = true
				break
			}
		}
		if !found {
			out = append(out, t)
		}
	}
	return out
}

// evictionState is what the manager remembers between rounds: when each
// threshold was first met, when each condition was last met, the thresholds met
// past their grace period, the conditions it reports, and the last observations.
type evictionState struct {
	firstObserved     map[string]time.Time
	thresholdsByKey   map[string]evictionThreshold
	conditionObserved map[corev1.NodeConditionType]time.Time
	met               []evictionThreshold
	conditions        []corev1.NodeConditionType
	lastObservations  signalObservations
}

// step runs one round of the kubelet's synchronize up to the choice of what to
// reclaim: it returns the thresholds that drive eviction now (met, past their
// grace period, with stats newer than the last round's), and updates the state,
// conditions included.
func (s *evictionState) step(cfg evictionConfig, obs signalObservations, now time.Time) []evictionThreshold {
	met := thresholdsMet(cfg.thresholds, obs, false)
	if len(s.met) > 0 {
		met = mergeThresholds(met, thresholdsMet(s.met, obs, true))
	}
	first := map[string]time.Time{}
	byKey := map[string]evictionThreshold{}
	for _, t := range met {
		at, ok := s.firstObserved[t.key()]
		if !ok {
			at = now
		}
		first[t.key()] = at
		byKey[t.key()] = t
	}
	lastSeen := map[corev1.NodeConditionType]time.Time{}
	for _, t := range met {
		if c, ok := signalToCondition[t.signal]; ok {
			lastSeen[c] = now
		}
	}
	for c, at := range s.conditionObserved {
		if _, ok := lastSeen[c]; !ok {
			lastSeen[c] = at
		}
	}
	var conditions []corev1.NodeConditionType
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		if at, ok := lastSeen[c]; ok && now.Sub(at) < cfg.pressureTransitionPeriod {
			conditions = append(conditions, c)
		}
	}
	var graceMet []evictionThreshold
	for _, k := range sortedTimeKeys(first) {
		t := byKey[k]
		if now.Sub(first[k]) >= t.gracePeriod {
			graceMet = append(graceMet, t)
		}
	}
	s.firstObserved, s.thresholdsByKey, s.conditionObserved = first, byKey, lastSeen
	s.conditions, s.met = conditions, graceMet

	var updated []evictionThreshold
	for _, t := range graceMet {
		o, ok := obs[t.signal]
		if !ok {
			continue
		}
		last, ok := s.lastObservations[t.signal]
		if !ok || o.time.IsZero() || o.time.After(last.time) {
			updated = append(updated, t)
		}
	}
	s.lastObservations = obs
	return updated
}

func sortedTimeKeys(m map[string]time.Time) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// reclaimTarget picks the threshold to act on, memory first, as the kubelet's
// byEvictionPriority and getReclaimableThreshold do.
func reclaimTarget(thresholds []evictionThreshold) (evictionThreshold, corev1.ResourceName, bool) {
	sorted := append([]evictionThreshold(nil), thresholds...)
	sort.SliceStable(sorted, func(i, j int) bool {
		mem := func(t evictionThreshold) bool {
			return t.signal == signalMemoryAvailable || t.signal == signalAllocatableMemoryAvailable
		}
		return mem(sorted[i]) && !mem(sorted[j])
	})
	for _, t := range sorted {
		if r, ok := signalToResource[t.signal]; ok {
			return t, r, true
		}
	}
	return evictionThreshold{}, "", false
}

// Which file system figures a disk signal ranks pods by.
type fsStatsType string

const (
	fsStatsLocalVolumeSource fsStatsType = "localVolumeSource"
	fsStatsLogs              fsStatsType = "logs"
	fsStatsRoot              fsStatsType = "root"
	fsStatsImages            fsStatsType = "images"
)

// podStatsFunc finds a pod's stats by UID.
type podStatsFunc func(pod *corev1.Pod) (statsapi.PodStats, bool)

func statsByUID(pods []statsapi.PodStats) podStatsFunc {
	m := make(map[string]statsapi.PodStats, len(pods))
	for _, p := range pods {
		m[p.PodRef.UID] = p
	}
	return func(pod *corev1.Pod) (statsapi.PodStats, bool) {
		s, ok := m[string(pod.UID)]
		return s, ok
	}
}

func bytesOf(v *uint64) *resource.Quantity {
	if v == nil {
		return resource.NewQuantity(0, resource.BinarySI)
	}
	return resource.NewQuantity(int64(*v), resource.BinarySI)
}

func memoryUsage(m *statsapi.MemoryStats) *resource.Quantity {
	if m == nil {
		return resource.NewQuantity(0, resource.BinarySI)
	}
	return bytesOf(m.WorkingSetBytes)
}

func fsUsage(fs *statsapi.FsStats, r corev1.ResourceName) *resource.Quantity {
	if fs == nil {
		return resource.NewQuantity(0, resource.BinarySI)
	}
	if r == resourceInodes {
		if fs.InodesUsed == nil {
			return resource.NewQuantity(0, resource.DecimalSI)
		}
		return resource.NewQuantity(int64(*fs.InodesUsed), resource.DecimalSI)
	}
	return bytesOf(fs.UsedBytes)
}

// localVolumeNames are the pod's volumes that use the node's file system (the
// kubelet's IsLocalEphemeralVolume, plus hostPath).
func localVolumeNames(pod *corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil || v.GitRepo != nil || v.ConfigMap != nil ||
			(v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumDefault) {
			out[v.Name] = true
		}
	}
	return out
}

// podDiskUsage sums what the pod uses of a disk resource in the figures measured.
func podDiskUsage(ps statsapi.PodStats, pod *corev1.Pod, measure []fsStatsType, r corev1.ResourceName) *resource.Quantity {
	has := func(t fsStatsType) bool {
		for _, m := range measure {
			if m == t {
				return true
			}
		}
		return false
	}
	total := resource.NewQuantity(0, resource.BinarySI)
	for _, c := range ps.Containers {
		if has(fsStatsRoot) {
			total.Add(*fsUsage(c.Rootfs, r))
		}
		if has(fsStatsLogs) {
			total.Add(*fsUsage(c.Logs, r))
		}
	}
	if has(fsStatsLocalVolumeSource) {
		local := localVolumeNames(pod)
		for _, v := range ps.VolumeStats {
			if local[v.Name] {
				total.Add(*fsUsage(&v.FsStats, r))
			}
		}
	}
	return total
}

func podRequest(pod *corev1.Pod, r corev1.ResourceName) *resource.Quantity {
	return resource.NewQuantity(podRequests(pod, r), resource.BinarySI)
}

// cmpBool puts true first.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

func cmpPriority(a, b *corev1.Pod) int {
	pa, pb := corev1helpers.PodPriority(a), corev1helpers.PodPriority(b)
	switch {
	case pa == pb:
		return 0
	case pa > pb:
		return 1
	}
	return -1
}

// usageCmp orders pods by a usage figure: pods without stats first, then as cmp.
func usageCmp(stats podStatsFunc, cmp func(a, b *corev1.Pod, sa, sb statsapi.PodStats) int) func(a, b *corev1.Pod) int {
	return func(a, b *corev1.Pod) int {
		sa, okA := stats(a)
		sb, okB := stats(b)
		if !okA || !okB {
			return cmpBool(!okA, !okB)
		}
		return cmp(a, b, sa, sb)
	}
}

func rankBy(pods []*corev1.Pod, cmps ...func(a, b *corev1.Pod) int) {
	sort.SliceStable(pods, func(i, j int) bool {
		for _, c := range cmps {
			if r := c(pods[i], pods[j]); r != 0 {
				return r < 0
			}
		}
		return false
	})
}

// rankMemoryPressure orders pods for eviction under memory pressure, as the
// kubelet: those using more than their request first, then lower priority, then
// the largest usage above request.
func rankMemoryPressure(pods []*corev1.Pod, stats podStatsFunc) {
	exceeds := usageCmp(stats, func(a, b *corev1.Pod, sa, sb statsapi.PodStats) int {
		return cmpBool(memoryUsage(sa.Memory).Cmp(*podRequest(a, corev1.ResourceMemory)) > 0,
			memoryUsage(sb.Memory).Cmp(*podRequest(b, corev1.ResourceMemory)) > 0)
	})
	usage := usageCmp(stats, func(a, b *corev1.Pod, sa, sb statsapi.PodStats) int {
		ua, ub := memoryUsage(sa.Memory), memoryUsage(sb.Memory)
		ua.Sub(*podRequest(a, corev1.ResourceMemory))
		ub.Sub(*podRequest(b, corev1.ResourceMemory))
		return ub.Cmp(*ua)
	})
	rankBy(pods, exceeds, cmpPriority, usage)
}

// rankPIDPressure orders pods by priority, then by most processes.
func rankPIDPressure(pods []*corev1.Pod, stats podStatsFunc) {
	procs := usageCmp(stats, func(a, b *corev1.Pod, sa, sb statsapi.PodStats) int {
		count := func(s statsapi.PodStats) uint64 {
			if s.ProcessStats == nil || s.ProcessStats.ProcessCount == nil {
				return 0
			}
			return *s.ProcessStats.ProcessCount
		}
		ca, cb := count(sa), count(sb)
		switch {
		case ca == cb:
			return 0
		case ca > cb:
			return -1
		}
		return 1
	})
	rankBy(pods, cmpPriority, procs)
}

// rankDiskPressure orders pods for a disk signal: those using more than their
// ephemeral-storage request first, then lower priority, then the largest usage
// above request.
func rankDiskPressure(measure []fsStatsType, r corev1.ResourceName) func([]*corev1.Pod, podStatsFunc) {
	return func(pods []*corev1.Pod, stats podStatsFunc) {
		exceeds := usageCmp(stats, func(a, b *corev1.Pod, sa, sb statsapi.PodStats) int {
			return cmpBool(podDiskUsage(sa, a, measure, r).Cmp(*podRequest(a, r)) > 0,
				podDiskUsage(sb, b, measure, r).Cmp(*podRequest(b, r)) > 0)
		})
		usage := usageCmp(stats, func(a, b *corev1.Pod, sa, sb statsapi.PodStats) int {
			ua, ub := podDiskUsage(sa, a, measure, r), podDiskUsage(sb, b, measure, r)
			ua.Sub(*podRequest(a, corev1.ResourceEphemeralStorage))
			ub.Sub(*podRequest(b, corev1.ResourceEphemeralStorage))
			return ub.Cmp(*ua)
		})
		rankBy(pods, exceeds, cmpPriority, usage)
	}
}

// rankFuncFor is the kubelet's buildSignalToRankFunc: with a dedicated image file
// system, nodefs signals rank by logs and local volumes and imagefs ones by the
// writable layers; without, every disk signal ranks by everything.
func rankFuncFor(signal evictionSignal, dedicatedImageFs bool) (func([]*corev1.Pod, podStatsFunc), bool) {
	switch signal {
	case signalMemoryAvailable, signalAllocatableMemoryAvailable:
		return rankMemoryPressure, true
	case signalPIDAvailable:
		return rankPIDPressure, true
	}
	r := signalToResource[signal]
	if r == "" {
		return nil, false
	}
	if !dedicatedImageFs {
		return rankDiskPressure([]fsStatsType{fsStatsImages, fsStatsRoot, fsStatsLogs, fsStatsLocalVolumeSource}, r), true
	}
	switch signal {
	case signalNodeFsAvailable, signalNodeFsInodesFree:
		return rankDiskPressure([]fsStatsType{fsStatsLogs, fsStatsLocalVolumeSource}, r), true
	}
	return rankDiskPressure([]fsStatsType{fsStatsRoot, fsStatsImages}, r), true
}

// Annotations of the Evicted event, as the kubelet sets them.
const (
	annotationOffendingContainers      = "offending_containers"
	annotationOffendingContainersUsage = "offending_containers_usage"
	annotationOffendingPod             = "offending_pod"
	annotationOffendingPodUsage        = "offending_pod_usage"
	annotationStarvedResource          = "starved_resource"
)

// evictionMessage is the kubelet's: the starved resource, the threshold and what
// was available, then (for memory) the pod over its pod-level request and each
// container using more than it requested; plus the Evicted event's annotations.
func evictionMessage(r corev1.ResourceName, pod *corev1.Pod, stats podStatsFunc, thresholds []evictionThreshold, obs signalObservations) (string, map[string]string) {
	annotations := map[string]string{}
	msg := fmt.Sprintf(nodeLowMessageFmt, r)
	for _, t := range thresholds {
		if signalToResource[t.signal] != r {
			continue
		}
		if o, ok := obs[t.signal]; ok {
			msg += fmt.Sprintf(thresholdMetMessageFmt, t.value.of(o.capacity), o.available)
			break
		}
	}
	ps, ok := stats(pod)
	if !ok {
		return msg, annotations
	}
	// PodLevelResources is beta and on in 1.37.
	if r == corev1.ResourceMemory && resourcehelper.IsPodLevelResourcesSet(pod) {
		if req, ok := pod.Spec.Resources.Requests[r]; ok && ps.Memory != nil {
			usage := memoryUsage(ps.Memory)
			msg += fmt.Sprintf(podMessageFmt, pod.Name, usage.String(), req.String(), r)
			annotations[annotationOffendingPod] = pod.Name
			annotations[annotationOffendingPodUsage] = usage.String()
		}
	}
	var names, usages []string
	containers := append(append([]corev1.Container{}, pod.Spec.Containers...), pod.Spec.InitContainers...)
	for _, cs := range ps.Containers {
		for _, c := range containers {
			if c.Name != cs.Name {
				continue
			}
			req := c.Resources.Requests[r]
			var usage *resource.Quantity
			switch r {
			case corev1.ResourceEphemeralStorage:
				if cs.Rootfs != nil && cs.Rootfs.UsedBytes != nil && cs.Logs != nil && cs.Logs.UsedBytes != nil {
					usage = resource.NewQuantity(int64(*cs.Rootfs.UsedBytes+*cs.Logs.UsedBytes), resource.BinarySI)
				}
			case corev1.ResourceMemory:
				if cs.Memory != nil && cs.Memory.WorkingSetBytes != nil {
					usage = resource.NewQuantity(int64(*cs.Memory.WorkingSetBytes), resource.BinarySI)
				}
			}
			if usage != nil && usage.Cmp(req) > 0 {
				msg += fmt.Sprintf(containerMessageFmt, c.Name, usage.String(), req.String(), r)
				names = append(names, c.Name)
				usages = append(usages, usage.String())
			}
			break
		}
	}
	annotations[annotationOffendingContainers] = strings.Join(names, ",")
	annotations[annotationOffendingContainersUsage] = strings.Join(usages, ",")
	annotations[annotationStarvedResource] = string(r)
	return msg, annotations
}

// localStorageViolation checks a pod against its local storage limits in the
// kubelet's order: an emptyDir over its sizeLimit, the pod's ephemeral storage
// over the sum of its containers' limits, a container over its own limit. It
// returns the eviction message and the metric's signal.
func localStorageViolation(pod *corev1.Pod, ps statsapi.PodStats, dedicatedImageFs bool) (message, signal string, ok bool) {
	used := map[string]*resource.Quantity{}
	for _, v := range ps.VolumeStats {
		if v.UsedBytes != nil {
			used[v.Name] = bytesOf(v.UsedBytes)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Sign() != 1 {
			continue
		}
		if u := used[v.Name]; u != nil && u.Cmp(*v.EmptyDir.SizeLimit) > 0 {
			return fmt.Sprintf(emptyDirMessageFmt, v.Name, v.EmptyDir.SizeLimit.String()), signalEmptyDirFsLimit, true
		}
	}
	if limit, ok := podEphemeralLimit(pod); ok {
		var usage resource.Quantity
		if ps.EphemeralStorage != nil && ps.EphemeralStorage.UsedBytes != nil {
			usage = *bytesOf(ps.EphemeralStorage.UsedBytes)
		}
		if usage.Cmp(limit) > 0 {
			return fmt.Sprintf(podEphemeralStorageMessageFmt, limit.String()), signalEphemeralPodFsLimit, true
		}
	}
	limits := map[string]resource.Quantity{}
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok && q.Value() != 0 {
			limits[c.Name] = q
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if !podsync.IsRestartableInitContainer(&c) {
			continue
		}
		if q, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok && q.Value() != 0 {
			limits[c.Name] = q
		}
	}
	for _, cs := range ps.Containers {
		limit, ok := limits[cs.Name]
		if !ok {
			continue
		}
		usage := fsUsage(cs.Logs, corev1.ResourceEphemeralStorage)
		if !dedicatedImageFs {
			usage.Add(*fsUsage(cs.Rootfs, corev1.ResourceEphemeralStorage))
		}
		if limit.Cmp(*usage) < 0 {
			return fmt.Sprintf(containerEphemeralStorageMsgFmt, cs.Name, limit.String()), signalEphemeralContainerFsLimit, true
		}
	}
	return "", "", false
}

// podEphemeralLimit is the pod's ephemeral-storage limit as the kubelet's
// PodLimits computes it: the app containers' (and sidecars') sum or the largest
// init container's, only when some container sets one.
func podEphemeralLimit(pod *corev1.Pod) (resource.Quantity, bool) {
	r := corev1.ResourceEphemeralStorage
	found := false
	var apps, sidecars, initMax resource.Quantity
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Limits[r]; ok {
			found = true
			apps.Add(q)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		q, ok := c.Resources.Limits[r]
		if ok {
			found = true
		}
		if podsync.IsRestartableInitContainer(&c) {
			sidecars.Add(q)
			if sidecars.Cmp(initMax) > 0 {
				initMax = sidecars.DeepCopy()
			}
			continue
		}
		t := sidecars.DeepCopy()
		t.Add(q)
		if t.Cmp(initMax) > 0 {
			initMax = t
		}
	}
	total := apps.DeepCopy()
	total.Add(sidecars)
	if initMax.Cmp(total) > 0 {
		total = initMax
	}
	if q, ok := pod.Spec.Overhead[r]; ok && found {
		total.Add(q)
	}
	return total, found
}

// isCriticalPod is the kubelet's IsCriticalPod: static and mirror pods and pods at
// system-critical priority are never evicted and always admitted.
func isCriticalPod(pod *corev1.Pod) bool {
	if src := pod.Annotations[staticpod.AnnotationConfigSource]; src != "" && src != "api" {
		return true
	}
	if _, ok := pod.Annotations[staticpod.AnnotationConfigMirror]; ok {
		return true
	}
	return pod.Spec.Priority != nil && *pod.Spec.Priority >= systemCriticalPriority
}

// evictionAdmit is the kubelet's eviction admit handler: with no pressure every
// pod is admitted; critical pods always are; under memory pressure alone, all
// but BestEffort pods are, and BestEffort ones that tolerate the memory-pressure
// taint; under any other pressure, none is.
func evictionAdmit(conditions []corev1.NodeConditionType, pod *corev1.Pod) (reason, message string, ok bool) {
	if len(conditions) == 0 || isCriticalPod(pod) {
		return "", "", true
	}
	if len(conditions) == 1 && conditions[0] == corev1.NodeMemoryPressure {
		if podsync.QOSClass(pod) != corev1.PodQOSBestEffort {
			return "", "", true
		}
		taint := &corev1.Taint{Key: corev1.TaintNodeMemoryPressure, Effect: corev1.TaintEffectNoSchedule}
		for i := range pod.Spec.Tolerations {
			// TaintTolerationComparisonOperators is alpha and off in 1.37.
			if pod.Spec.Tolerations[i].ToleratesTaint(klog.Background(), taint, false) {
				return "", "", true
			}
		}
	}
	return evictionReason, fmt.Sprintf(nodeConditionMessageFmt, conditions), false
}
