package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/cri"
)

// KubeletVersion is what the node reports as nodeInfo.kubeletVersion: the Kubernetes
// version nodekit matches, with build metadata saying it is nodekit's kubelet (still
// valid semver, so version skew checks parse it).
const KubeletVersion = "v1.37.2+nodekit"

// Annotation the kubelet sets on its Node when the attach/detach controller manages
// its volumes (enableControllerAttachDetach, default true).
const annotationControllerManagedAttachDetach = "volumes.kubernetes.io/controller-managed-attach-detach"

// nodeStatusUpdateRetry is how many times the kubelet tries one node status update.
const nodeStatusUpdateRetry = 5

// runtimeService is what the node status needs from the CRI runtime; *cri.Client has it.
type runtimeService interface {
	Status(ctx context.Context) (*runtimeapi.RuntimeStatus, error)
	Version(ctx context.Context) (*runtimeapi.VersionResponse, error)
	ListImages(ctx context.Context, filter *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error)
}

// nodeStatus registers the Node and keeps its status current, with the setters of
// pkg/kubelet/nodestatus.
type nodeStatus struct {
	client   kubernetes.Interface
	name     string
	hostname string
	nodeIP   net.IP
	labels   map[string]string
	cfg      *kubeletv1beta1.KubeletConfiguration
	rootDir  string
	runtime  runtimeService
	machine  *machine
	clock    clock.WithTicker
	recorder record.EventRecorder
	// eviction, when set, is where the pressure conditions come from.
	eviction *evictionManager

	mu         sync.Mutex
	lastReport time.Time
	// runtimeReady is the last readiness verdict, for /healthz and pod admission.
	readiness cri.Readiness
	// seen is the Node as last read from the API server by a status update; pod
	// admission falls back to it while the Node informer has not listed the Node.
	seen *corev1.Node
	// nodes, when set, lists this kubelet's own Node from a watch (the kubelet's
	// nodeLister); nodeSynced latches once the Node has been seen there.
	nodes      corelisters.NodeLister
	nodeSynced atomic.Bool
}

// watchNode starts an informer on this kubelet's own Node (a field selector on its
// name), as NewMainKubelet does, so pod admission judges against the Node as it is
// now: a label added just before a pod is bound is already there. It returns once
// the informer has started; the informer stops with ctx.
func (n *nodeStatus) watchNode(ctx context.Context) {
	// One informer, not a SharedInformerFactory: the factory links the informers
	// and listers of every API group into the binary.
	inf := coreinformers.NewFilteredNodeInformer(n.client, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, n.name).String()
	})
	n.nodes = corelisters.NewNodeLister(inf.GetIndexer())
	klog.InfoS("Attempting to sync node with API server")
	go inf.RunWithContext(ctx)
}

// nodeHasSynced tells whether this kubelet's Node has reached the Node informer
// (newNodeHasSyncedFunc); without an informer (standalone) it is always true.
func (n *nodeStatus) nodeHasSynced() bool {
	if n.nodes == nil || n.nodeSynced.Load() {
		return true
	}
	if _, err := n.nodes.Get(n.name); err == nil {
		n.nodeSynced.Store(true)
		return true
	}
	return false
}

// admissionNode is the Node pod admission judges against, as the kubelet's
// getNodeAnyWay: the one the Node informer holds, else the one last read by a
// status update, else the Node this kubelet registers (its labels and
// registerWithTaints).
func (n *nodeStatus) admissionNode() *corev1.Node {
	if n.nodes != nil {
		if node, err := n.nodes.Get(n.name); err == nil {
			return node
		}
	}
	n.mu.Lock()
	seen := n.seen
	n.mu.Unlock()
	if seen != nil {
		return seen
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			corev1.LabelHostname: n.hostname, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH,
		}},
		Spec: corev1.NodeSpec{Taints: append([]corev1.Taint(nil), n.cfg.RegisterWithTaints...)},
	}
	for k, v := range n.labels {
		node.Labels[k] = v
	}
	return node
}

func (n *nodeStatus) nodeRef() *corev1.ObjectReference {
	// The kubelet's node reference uses the node name as UID, so events group by node.
	return &corev1.ObjectReference{Kind: "Node", Name: n.name, UID: types.UID(n.name)}
}

func (n *nodeStatus) event(eventType, reason string) {
	if n.recorder != nil {
		n.recorder.Eventf(n.nodeRef(), eventType, reason, "Node %s status is now: %s", n.name, reason)
	}
}

// initialNode is the Node the kubelet registers (pkg/kubelet/kubelet_node_status.go
// initialNode): default labels, --node-labels, registerWithTaints, the attach/detach
// annotation, then every status setter.
func (n *nodeStatus) initialNode(ctx context.Context) *corev1.Node {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.name,
			Labels: map[string]string{
				corev1.LabelHostname:      n.hostname,
				corev1.LabelOSStable:      runtime.GOOS,
				corev1.LabelArchStable:    runtime.GOARCH,
				"beta.kubernetes.io/os":   runtime.GOOS,
				"beta.kubernetes.io/arch": runtime.GOARCH,
			},
		},
		Spec: corev1.NodeSpec{
			Taints:     append([]corev1.Taint(nil), n.cfg.RegisterWithTaints...),
			PodCIDR:    n.cfg.PodCIDR,
			ProviderID: n.cfg.ProviderID,
		},
	}
	if n.cfg.PodCIDR != "" {
		node.Spec.PodCIDRs = []string{n.cfg.PodCIDR}
	}
	for k, v := range n.labels {
		node.Labels[k] = v
	}
	if *n.cfg.EnableControllerAttachDetach {
		node.Annotations = map[string]string{annotationControllerManagedAttachDetach: "true"}
	}
	n.setStatus(ctx, node)
	return node
}

// register creates the Node, or adopts an existing one by reconciling the kubelet's
// default labels and the attach/detach annotation; it retries with the kubelet's
// backoff (100 ms doubling to 7 s) until it succeeds or ctx ends.
func (n *nodeStatus) register(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		err := n.tryRegister(ctx)
		if err == nil {
			klog.InfoS("Successfully registered node", "node", klog.KRef("", n.name))
			return nil
		}
		klog.ErrorS(err, "Unable to register node with API server", "node", klog.KRef("", n.name))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.clock.After(delay):
		}
		delay = min(2*delay, 7*time.Second)
	}
}

func (n *nodeStatus) tryRegister(ctx context.Context) error {
	klog.InfoS("Attempting to register node", "node", klog.KRef("", n.name))
	node := n.initialNode(ctx)
	_, err := n.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %q: %w", n.name, err)
	}
	existing, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get existing node %q: %w", n.name, err)
	}
	updated := existing.DeepCopy()
	changed := false
	for _, k := range []string{corev1.LabelHostname, corev1.LabelOSStable, corev1.LabelArchStable, "beta.kubernetes.io/os", "beta.kubernetes.io/arch"} {
		if updated.Labels[k] != node.Labels[k] {
			if updated.Labels == nil {
				updated.Labels = map[string]string{}
			}
			updated.Labels[k] = node.Labels[k]
			changed = true
		}
	}
	want := *n.cfg.EnableControllerAttachDetach
	if (updated.Annotations[annotationControllerManagedAttachDetach] == "true") != want {
		if want {
			if updated.Annotations == nil {
				updated.Annotations = map[string]string{}
			}
			updated.Annotations[annotationControllerManagedAttachDetach] = "true"
		} else {
			delete(updated.Annotations, annotationControllerManagedAttachDetach)
		}
		changed = true
	}
	if changed {
		if _, err := n.client.CoreV1().Nodes().Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adopt existing node %q: %w", n.name, err)
		}
	}
	klog.InfoS("Node was previously registered", "node", klog.KRef("", n.name))
	return nil
}

// setStatus runs the kubelet's setters, in its order, on node.
func (n *nodeStatus) setStatus(ctx context.Context, node *corev1.Node) {
	n.setAddresses(node)
	n.setMachineInfo(node)
	n.setVersionInfo(ctx, node)
	node.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: n.cfg.Port}}
	n.setImages(ctx, node)
	node.Status.NodeInfo.OperatingSystem = runtime.GOOS
	node.Status.NodeInfo.Architecture = runtime.GOARCH
	now := metav1.NewTime(n.clock.Now())
	p := n.pressure()
	n.pressureCondition(node, now, corev1.NodeMemoryPressure, p.memory,
		"KubeletHasInsufficientMemory", "kubelet has insufficient memory available", "NodeHasInsufficientMemory",
		"KubeletHasSufficientMemory", "kubelet has sufficient memory available", "NodeHasSufficientMemory")
	n.pressureCondition(node, now, corev1.NodeDiskPressure, p.disk,
		"KubeletHasDiskPressure", "kubelet has disk pressure", "NodeHasDiskPressure",
		"KubeletHasNoDiskPressure", "kubelet has no disk pressure", "NodeHasNoDiskPressure")
	n.pressureCondition(node, now, corev1.NodePIDPressure, p.pid,
		"KubeletHasInsufficientPID", "kubelet has insufficient PID available", "NodeHasInsufficientPID",
		"KubeletHasSufficientPID", "kubelet has sufficient PID available", "NodeHasSufficientPID")
	n.readyCondition(ctx, node, now)
}

func (n *nodeStatus) setAddresses(node *corev1.Node) {
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.nodeIP.String()},
		{Type: corev1.NodeHostName, Address: n.hostname},
	}
}

func (n *nodeStatus) setMachineInfo(node *corev1.Node) {
	m := n.machine
	node.Status.NodeInfo.MachineID = m.machineID()
	node.Status.NodeInfo.SystemUUID = m.systemUUID()
	bootID := m.bootID()
	if node.Status.NodeInfo.BootID != "" && node.Status.NodeInfo.BootID != bootID && n.recorder != nil {
		n.recorder.Eventf(n.nodeRef(), corev1.EventTypeWarning, "Rebooted",
			"Node %s has been rebooted, boot id: %s", n.name, bootID)
	}
	node.Status.NodeInfo.BootID = bootID

	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(m.numCPU())*1000, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(m.meminfo()["MemTotal"], resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(int64(n.cfg.MaxPods), resource.DecimalSI),
	}
	hugePages := m.hugePages()
	for k, v := range hugePages {
		capacity[k] = v
	}
	if *n.cfg.LocalStorageCapacityIsolation {
		if fs, err := m.fs(n.rootDir); err == nil {
			capacity[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(fs.capacity, resource.BinarySI)
		}
	}
	if node.Status.Capacity == nil {
		node.Status.Capacity = corev1.ResourceList{}
	}
	for k, v := range capacity {
		node.Status.Capacity[k] = v
	}

	reservation := n.allocatableReservation(capacity)
	node.Status.Allocatable = corev1.ResourceList{}
	for k, v := range node.Status.Capacity {
		value := v.DeepCopy()
		if r, ok := reservation[k]; ok {
			value.Sub(r)
		}
		if value.Sign() < 0 {
			value.Set(0)
		}
		node.Status.Allocatable[k] = value
	}
	// Huge pages come out of allocatable memory.
	for _, v := range hugePages {
		mem := node.Status.Allocatable[corev1.ResourceMemory]
		mem.Sub(v)
		if mem.Sign() < 0 {
			mem.Set(0)
		}
		node.Status.Allocatable[corev1.ResourceMemory] = mem
	}
}

// allocatableReservation is kubeReserved + systemReserved + the hard eviction
// thresholds for memory and ephemeral storage (pkg/kubelet/cm GetNodeAllocatableReservation).
func (n *nodeStatus) allocatableReservation(capacity corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	add := func(name corev1.ResourceName, q resource.Quantity) {
		cur := out[name]
		cur.Add(q)
		out[name] = cur
	}
	for _, reserved := range []map[string]string{n.cfg.KubeReserved, n.cfg.SystemReserved} {
		for k, v := range reserved {
			if q, err := resource.ParseQuantity(v); err == nil {
				add(corev1.ResourceName(k), q)
			}
		}
	}
	if t, ok := n.cfg.EvictionHard["memory.available"]; ok {
		if th, err := parseThreshold(t); err == nil {
			mem := capacity[corev1.ResourceMemory]
			add(corev1.ResourceMemory, *resource.NewQuantity(th.of(mem.Value()), resource.BinarySI))
		}
	}
	if t, ok := n.cfg.EvictionHard["nodefs.available"]; ok {
		if th, err := parseThreshold(t); err == nil {
			if storage, ok := capacity[corev1.ResourceEphemeralStorage]; ok {
				add(corev1.ResourceEphemeralStorage, *resource.NewQuantity(th.of(storage.Value()), resource.BinarySI))
			}
		}
	}
	return out
}

func (n *nodeStatus) setVersionInfo(ctx context.Context, node *corev1.Node) {
	node.Status.NodeInfo.KernelVersion = n.machine.kernelVersion()
	node.Status.NodeInfo.OSImage = n.machine.osImage()
	runtimeName, runtimeVersion := "", "Unknown"
	if v, err := n.runtime.Version(ctx); err == nil {
		runtimeName, runtimeVersion = v.GetRuntimeName(), v.GetRuntimeVersion()
	}
	node.Status.NodeInfo.ContainerRuntimeVersion = fmt.Sprintf("%s://%s", runtimeName, runtimeVersion)
	node.Status.NodeInfo.KubeletVersion = KubeletVersion
}

// maxNamesPerImage is MaxNamesPerImageInNodeStatus.
const maxNamesPerImage = 5

func (n *nodeStatus) setImages(ctx context.Context, node *corev1.Node) {
	images, err := n.runtime.ListImages(ctx, nil)
	if err != nil {
		klog.ErrorS(err, "Error getting image list")
		node.Status.Images = nil
		return
	}
	// Largest first, as the image manager sorts them, then cut at nodeStatusMaxImages.
	sortImagesBySize(images)
	if limit := int(*n.cfg.NodeStatusMaxImages); limit > -1 && limit < len(images) {
		images = images[:limit]
	}
	var out []corev1.ContainerImage
	for _, im := range images {
		names := append(append([]string(nil), im.GetRepoDigests()...), im.GetRepoTags()...)
		if len(names) > maxNamesPerImage {
			names = names[:maxNamesPerImage]
		}
		out = append(out, corev1.ContainerImage{Names: names, SizeBytes: int64(im.GetSize())})
	}
	node.Status.Images = out
}

func sortImagesBySize(images []*runtimeapi.Image) {
	for i := 1; i < len(images); i++ {
		for j := i; j > 0 && images[j].GetSize() > images[j-1].GetSize(); j-- {
			images[j], images[j-1] = images[j-1], images[j]
		}
	}
}

// pressureCondition is the kubelet's MemoryPressure/DiskPressure/PIDPressure setter.
func (n *nodeStatus) pressureCondition(node *corev1.Node, now metav1.Time, t corev1.NodeConditionType, under bool,
	trueReason, trueMessage, trueEvent, falseReason, falseMessage, falseEvent string) {
	var cond *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			cond = &node.Status.Conditions[i]
		}
	}
	isNew := cond == nil
	if isNew {
		cond = &corev1.NodeCondition{Type: t, Status: corev1.ConditionUnknown}
	}
	cond.LastHeartbeatTime = now
	if under {
		if cond.Status != corev1.ConditionTrue {
			cond.Status, cond.Reason, cond.Message, cond.LastTransitionTime = corev1.ConditionTrue, trueReason, trueMessage, now
			n.event(corev1.EventTypeNormal, trueEvent)
		}
	} else if cond.Status != corev1.ConditionFalse {
		cond.Status, cond.Reason, cond.Message, cond.LastTransitionTime = corev1.ConditionFalse, falseReason, falseMessage, now
		n.event(corev1.EventTypeNormal, falseEvent)
	}
	if isNew {
		node.Status.Conditions = append(node.Status.Conditions, *cond)
	}
}

// readyCondition is the kubelet's Ready setter, gated by the runtime's readiness and
// the required capacities; it stays the last condition.
func (n *nodeStatus) readyCondition(ctx context.Context, node *corev1.Node, now metav1.Time) {
	rd := n.checkRuntime(ctx)
	cond := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: cri.ReasonReady, Message: cri.MessageReady, LastHeartbeatTime: now,
	}
	var errs []string
	if !rd.Ready {
		errs = append(errs, rd.Message)
	}
	var missing []string
	required := []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods}
	if *n.cfg.LocalStorageCapacityIsolation {
		required = append(required, corev1.ResourceEphemeralStorage)
	}
	for _, r := range required {
		if _, ok := node.Status.Capacity[r]; !ok {
			missing = append(missing, string(r))
		}
	}
	if len(missing) > 0 {
		errs = append(errs, "missing node capacity for resources: "+strings.Join(missing, ", "))
	}
	if len(errs) > 0 {
		msg := errs[0]
		if len(errs) > 1 {
			msg = "[" + strings.Join(errs, ", ") + "]"
		}
		cond = corev1.NodeCondition{
			Type: corev1.NodeReady, Status: corev1.ConditionFalse,
			Reason: cri.ReasonNotReady, Message: msg, LastHeartbeatTime: now,
		}
	}
	updated, changed := false, false
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type != corev1.NodeReady {
			continue
		}
		if node.Status.Conditions[i].Status == cond.Status {
			cond.LastTransitionTime = node.Status.Conditions[i].LastTransitionTime
		} else {
			cond.LastTransitionTime = now
			changed = true
		}
		node.Status.Conditions[i] = cond
		updated = true
		break
	}
	if !updated {
		cond.LastTransitionTime = now
		node.Status.Conditions = append(node.Status.Conditions, cond)
	}
	if changed {
		if cond.Status == corev1.ConditionTrue {
			n.event(corev1.EventTypeNormal, "NodeReady")
		} else {
			n.event(corev1.EventTypeNormal, "NodeNotReady")
			klog.InfoS("Node became not ready", "node", klog.KObj(node), "condition", readyConditionLog(cond))
		}
	}
}

// readyConditionLog renders a condition the way the kubelet's log line shows it:
// {"Type":"Ready","Status":"False",...} (Go field names, as its %+v-style JSON).
type readyConditionLog corev1.NodeCondition

func (c readyConditionLog) MarshalLog() any {
	return struct {
		Type               corev1.NodeConditionType
		Status             corev1.ConditionStatus
		LastHeartbeatTime  metav1.Time
		LastTransitionTime metav1.Time
		Reason             string
		Message            string
	}{c.Type, c.Status, c.LastHeartbeatTime, c.LastTransitionTime, c.Reason, c.Message}
}

// checkRuntime asks the runtime for its status, logs the kubelet's lines when it is
// not ready, and keeps the verdict for /healthz and admission.
func (n *nodeStatus) checkRuntime(ctx context.Context) cri.Readiness {
	st, err := n.runtime.Status(ctx)
	var rd cri.Readiness
	if err != nil {
		klog.ErrorS(err, "Container runtime sanity check failed")
		rd = cri.Readiness{Reason: cri.ReasonNotReady, Message: cri.MessageRuntimeDown}
	} else {
		rd = cri.ReadinessFromStatus(st)
		for _, c := range st.GetConditions() {
			if c.GetType() == runtimeapi.NetworkReady && !c.GetStatus() {
				klog.ErrorS(nil, "Container runtime network not ready", "networkReady", conditionString(c))
			}
			if c.GetType() == runtimeapi.RuntimeReady && !c.GetStatus() {
				klog.ErrorS(nil, "Container runtime not ready", "runtimeReady", conditionString(c))
			}
		}
	}
	n.mu.Lock()
	n.readiness = rd
	n.mu.Unlock()
	return rd
}

// conditionString is how the kubelet prints a runtime condition.
func conditionString(c *runtimeapi.RuntimeCondition) string {
	return fmt.Sprintf("%s=%t reason:%s message:%s", c.GetType(), c.GetStatus(), c.GetReason(), c.GetMessage())
}

func (n *nodeStatus) lastReadiness() cri.Readiness {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.readiness
}

// run updates the node status every nodeStatusUpdateFrequency until ctx ends.
func (n *nodeStatus) run(ctx context.Context) {
	t := n.clock.NewTicker(n.cfg.NodeStatusUpdateFrequency.Duration)
	defer t.Stop()
	for {
		if err := n.update(ctx); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "Unable to update node status")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// update tries nodeStatusUpdateRetry times to write the node status.
func (n *nodeStatus) update(ctx context.Context) error {
	var err error
	for i := 0; i < nodeStatusUpdateRetry; i++ {
		if err = n.tryUpdate(ctx, i); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		klog.ErrorS(err, "Error updating node status, will retry")
	}
	return fmt.Errorf("update node status exceeds retry count: %w", err)
}

func (n *nodeStatus) tryUpdate(ctx context.Context, attempt int) error {
	old, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("error getting node %q: %w", n.name, err)
	}
	node := old.DeepCopy()
	n.setStatus(ctx, node)
	n.mu.Lock()
	n.seen = old
	due := n.clock.Since(n.lastReport) >= n.cfg.NodeStatusReportFrequency.Duration
	n.mu.Unlock()
	if !due && !nodeStatusChanged(&old.Status, &node.Status) {
		return nil
	}
	if err := n.patchStatus(ctx, old, node); err != nil {
		return err
	}
	n.mu.Lock()
	n.lastReport = n.clock.Now()
	n.mu.Unlock()
	return nil
}

// patchStatus sends a strategic merge patch of the status subresource, as
// nodeutil.PatchNodeStatus does, with the old resourceVersion so a concurrent
// writer makes it Conflict and the caller re-reads.
func (n *nodeStatus) patchStatus(ctx context.Context, old, node *corev1.Node) error {
	oldData, err := json.Marshal(corev1.Node{Status: old.Status})
	if err != nil {
		return err
	}
	newData, err := json.Marshal(corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: old.UID}, Status: node.Status})
	if err != nil {
		return err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldData, newData, corev1.Node{})
	if err != nil {
		return fmt.Errorf("make node status patch: %w", err)
	}
	_, err = n.client.CoreV1().Nodes().Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch node %q status: %w", n.name, err)
	}
	return nil
}

// nodeStatusChanged compares two statuses ignoring condition heartbeat times, as the
// kubelet's nodeStatusHasChanged does.
func nodeStatusChanged(a, b *corev1.NodeStatus) bool {
	strip := func(s *corev1.NodeStatus) *corev1.NodeStatus {
		c := s.DeepCopy()
		for i := range c.Conditions {
			c.Conditions[i].LastHeartbeatTime = metav1.Time{}
		}
		return c
	}
	return !apiequality.Semantic.DeepEqual(strip(a), strip(b))
}

// threshold is an eviction threshold: a quantity or a percentage of capacity.
type threshold struct {
	quantity *resource.Quantity
	percent  float64
}

func parseThreshold(s string) (threshold, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return threshold{}, fmt.Errorf("invalid percentage %q", s)
		}
		return threshold{percent: f}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return threshold{}, fmt.Errorf("invalid quantity %q: %w", s, err)
	}
	if q.Sign() < 0 {
		return threshold{}, fmt.Errorf("eviction threshold %q must be positive", s)
	}
	return threshold{quantity: &q}, nil
}

// of returns the threshold in absolute units for a capacity.
func (t threshold) of(capacity int64) int64 {
	if t.quantity != nil {
		return t.quantity.Value()
	}
	return int64(float64(capacity) * t.percent / 100)
}

type pressures struct{ memory, disk, pid bool }

// pressure compares the host's readings with the hard eviction thresholds:
// memory.available (MemAvailable) for MemoryPressure, nodefs.available and
// nodefs.inodesFree of the root dir's filesystem for DiskPressure, pid.available for
// PIDPressure when configured.
func (n *nodeStatus) pressure() pressures {
	if n.eviction != nil {
		// As the kubelet: the eviction manager's conditions, transition period included.
		return n.eviction.pressures()
	}
	var p pressures
	mi := n.machine.meminfo()
	if t, ok := n.cfg.EvictionHard["memory.available"]; ok {
		if th, err := parseThreshold(t); err == nil {
			if avail, ok := mi["MemAvailable"]; ok && avail < th.of(mi["MemTotal"]) {
				p.memory = true
			}
		}
	}
	if fs, err := n.machine.fs(n.rootDir); err == nil {
		if t, ok := n.cfg.EvictionHard["nodefs.available"]; ok {
			if th, err := parseThreshold(t); err == nil && fs.available < th.of(fs.capacity) {
				p.disk = true
			}
		}
		if t, ok := n.cfg.EvictionHard["nodefs.inodesFree"]; ok {
			if th, err := parseThreshold(t); err == nil && fs.inodes > 0 && fs.inodesFree < th.of(fs.inodes) {
				p.disk = true
			}
		}
	}
	if t, ok := n.cfg.EvictionHard["pid.available"]; ok {
		if th, err := parseThreshold(t); err == nil {
			max, _ := strconv.ParseInt(n.machine.read("proc/sys/kernel/pid_max"), 10, 64)
			running := n.machine.runningProcesses()
			if max > 0 && max-running < th.of(max) {
				p.pid = true
			}
		}
	}
	return p
}

// allocatable is the node's allocatable resources as the status reports them.
func (n *nodeStatus) allocatable() corev1.ResourceList {
	node := &corev1.Node{}
	n.setMachineInfo(node)
	return node.Status.Allocatable
}
