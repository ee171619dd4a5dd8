package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/reference"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/podenv"
	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/probe"
	"github.com/nodekit-dev/nodekit/staticpod"
	"github.com/nodekit-dev/nodekit/volume"
)

type podManagerConfig struct {
	client   kubernetes.Interface
	nodeName string
	cfg      *kubeletv1beta1.KubeletConfiguration
	rootDir  string
	runtime  *cri.Client
	// logs rotates container logs (nil when rotation is off); containers removed
	// through the syncer lose their log files first, rotated ones included.
	logs     *containerLogManager
	recorder record.EventRecorder
	health   *health
	node     *nodeStatus
	nodeIP   net.IP
}

// Pod worker timings (pkg/kubelet/pod_workers.go): a pod whose sync failed is
// retried after workerBackOffPeriod; relistPeriod is the PLEG's.
const (
	workerBackOffPeriod = 10 * time.Second
	relistPeriod        = time.Second
)

// podManager runs the pods bound to the node and the static pods: one worker per pod
// calling podsync, a relist that wakes workers whose containers changed, probes, and
// a status manager writing pod status to the API server.
type podManager struct {
	cfg     podManagerConfig
	clock   clock.WithTicker
	syncer  *podsync.Syncer
	probes  *probe.Manager
	volumes *volume.Manager
	// trustBundles serves clusterTrustBundle projections; nil without an API server.
	trustBundles *volume.ClusterTrustBundles
	// podCerts issues podCertificate projections; nil without an API server.
	podCerts *volume.PodCertificateIssuer
	builder  *configBuilder
	// sysctls admits pods by their securityContext.sysctls.
	sysctls *sysctlAllowlist
	cgroups *podCgroups
	// pullSecrets are the pods' imagePullSecrets, read once per sync.
	pullSecrets *pullSecretCredentials
	status      *statusManager
	events      *eventAdapter
	// alloc holds what each admitted pod was allocated (in-place resize).
	alloc *allocations
	// actuated holds what each container was last created or updated with
	// (podsync's ActuatedStore), checkpointed as actuated_pods_state.
	actuated *resourceCheckpoint
	hostIPs  []string
	// eviction admits pods against the node's pressure conditions; nil admits all.
	eviction *evictionManager

	mu   sync.Mutex
	pods map[types.UID]*podEntry
	// fingerprints of the last relist, per pod UID.
	fingerprints map[types.UID]string
	// apiSynced: the API pod informer has listed once; staticLoaded: the static pod
	// folder was read once. Orphan sandboxes are removed only when both are true, so
	// a kubelet starting while the API server is down removes nothing.
	apiSynced, staticLoaded bool
	wg                      sync.WaitGroup
	workerCtx               context.Context
}

// podEntry is one pod the kubelet knows, with its worker.
type podEntry struct {
	pod       *corev1.Pod
	static    bool
	wake      chan struct{}
	firstSeen time.Time
	admitted  bool
	rejected  bool
	// gone: the pod left the desired set (deleted from the API or the folder).
	gone    bool
	done    chan struct{}
	started bool // running observed once (for kubelet_pod_start_duration_seconds)
	// status is the last computed status (for the probe manager).
	status *corev1.PodStatus
	// evict is the eviction manager's request, once it evicts the pod.
	evict *evictionRequest
}

func newPodManager(cfg podManagerConfig) (*podManager, error) {
	m := &podManager{
		cfg: cfg, clock: clock.RealClock{}, pods: map[types.UID]*podEntry{},
		fingerprints: map[types.UID]string{},
	}
	m.hostIPs = []string{cfg.nodeIP.String()}
	m.alloc = newAllocations(m.clock.Now, openResourceCheckpoint(cfg.rootDir, allocatedPodsStateFile))
	m.actuated = openResourceCheckpoint(cfg.rootDir, actuatedPodsStateFile)
	m.events = &eventAdapter{recorder: cfg.recorder}
	var envSource podenv.Source = emptyEnvSource{}
	var volSources volume.Sources
	if cfg.client != nil {
		envSource = podenv.ClientsetSource(cfg.client)
		volSources = volume.ClientsetSources(cfg.client)
		// The kubelet's cache size: two merged bundles per pod.
		ctbs, err := volume.NewClusterTrustBundles(volume.ClusterTrustBundlesConfig{Client: cfg.client, CacheSize: 2 * int(cfg.cfg.MaxPods)})
		if err != nil {
			return nil, err
		}
		m.trustBundles = ctbs
		if m.podCerts, err = volume.NewPodCertificateIssuer(volume.PodCertificateIssuerConfig{Client: cfg.client, NodeName: cfg.nodeName}); err != nil {
			return nil, err
		}
	}
	env, vols, err := newEnvAndVolumes(cfg, envSource, volSources, m.trustBundles, m.podCerts)
	if err != nil {
		return nil, err
	}
	m.volumes = vols
	if m.sysctls, err = newPodSysctlAllowlist(cfg); err != nil {
		return nil, err
	}
	resolv, _ := os.ReadFile(*cfg.cfg.ResolverConfig)
	cg, err := newPodCgroups(cfg.cfg)
	if err != nil {
		return nil, err
	}
	if cfg.node != nil {
		if err := cg.start(cgroupAllocatable(cfg.node), nil); err != nil {
			return nil, fmt.Errorf("failed to start the QoS cgroups: %w", err)
		}
		if cg.perQOS && cfg.recorder != nil {
			cfg.recorder.Eventf(cfg.node.nodeRef(), corev1.EventTypeNormal, "NodeAllocatableEnforced", "Updated Node Allocatable limit across pods")
		}
	}
	m.cgroups = cg
	m.pullSecrets = &pullSecretCredentials{secrets: envSource, events: m.events}
	m.builder = &configBuilder{cfg: cfg.cfg, rootDir: cfg.rootDir, env: env, volumes: vols, hostIPs: m.hostIPs,
		hostResolv: string(resolv), events: m.events, cgroups: cg, noImageMounts: imageMountsMissing(cfg.runtime.RuntimeVersion())}
	pm, err := probe.NewManager(probe.Config{
		Status:  probe.PodStatusFunc(m.podStatusForProbes),
		Prober:  probe.NewProber(probe.Options{Execer: cfg.runtime}),
		Metrics: probeMetrics{},
		Events:  m.events,
	})
	if err != nil {
		return nil, err
	}
	m.probes = pm
	var recorder podsync.EventRecorder
	if cfg.recorder != nil {
		recorder = cfg.recorder
	}
	s, err := podsync.New(podsync.Config{
		Runtime:     logCleaningRuntime{Client: cfg.runtime, logs: cfg.logs},
		Builder:     m.builder,
		Events:      recorder,
		Probes:      podsync.ProbeResultsFunc(m.probeResult),
		RuntimeName: cfg.runtime.RuntimeVersion().GetRuntimeName(),
		Credentials: m.pullSecrets,
		PodCgroups:  podResizer{cg},
		Actuated:    m.actuated,
	})
	if err != nil {
		return nil, err
	}
	m.syncer = s
	m.status = newStatusManager(cfg.client, m.clock)
	return m, nil
}

// newEnvAndVolumes builds the pods' environment builder and volume manager. The
// node's allocatable is the default for a limits.* resourceFieldRef whose
// container sets no limit, in env vars and downwardAPI volume files alike (the
// kubelet's defaultPodLimitsForDownwardAPI), and the size of memory-backed
// emptyDirs. It is read once: machine capacity and reservations do not change
// while the kubelet runs.
func newEnvAndVolumes(cfg podManagerConfig, envSource podenv.Source, volSources volume.Sources, ctbs *volume.ClusterTrustBundles, podCerts *volume.PodCertificateIssuer) (*podenv.Builder, *volume.Manager, error) {
	var allocatable corev1.ResourceList
	if cfg.node != nil {
		allocatable = cfg.node.allocatable()
	}
	env, err := podenv.New(podenv.Config{Source: envSource, NodeAllocatable: allocatable})
	if err != nil {
		return nil, nil, err
	}
	vc := volume.Config{RootDir: cfg.rootDir, Sources: volSources, NodeAllocatable: allocatable}
	if ctbs != nil {
		vc.TrustAnchors = ctbs
	}
	if podCerts != nil {
		vc.PodCertificates = podCerts
	}
	vols, err := volume.New(vc)
	if err != nil {
		return nil, nil, err
	}
	return env, vols, nil
}

// probeResult adapts the probe manager's cache to podsync (IDs without the scheme).
func (m *podManager) probeResult(t podsync.ProbeType, containerID string) (podsync.ProbeResult, bool) {
	var pt probe.Type
	switch t {
	case podsync.Liveness:
		pt = probe.Liveness
	case podsync.Readiness:
		pt = probe.Readiness
	default:
		pt = probe.Startup
	}
	// The probe manager keys results by the status's container ID
	// ("containerd://<id>"); podsync's documentation says it passes the bare ID but
	// it passes the status form, so take either.
	if !strings.Contains(containerID, "://") {
		containerID = m.runtimeName() + "://" + containerID
	}
	k, ok := m.probes.Result(pt, containerID)
	if !ok {
		return podsync.ProbeUnknown, false
	}
	switch k {
	case probe.Success, probe.Warning:
		return podsync.ProbeSuccess, true
	case probe.Failure:
		return podsync.ProbeFailure, true
	}
	return podsync.ProbeUnknown, true
}

func (m *podManager) runtimeName() string {
	if n := m.cfg.runtime.RuntimeVersion().GetRuntimeName(); n != "" {
		return n
	}
	return podsync.DefaultRuntimeName
}

func (m *podManager) podStatusForProbes(uid types.UID) (*corev1.PodStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[uid]
	if !ok || e.status == nil {
		return nil, false
	}
	return e.status, true
}

func (m *podManager) run(ctx context.Context) error {
	m.mu.Lock()
	m.workerCtx = ctx
	m.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	goRun := func(fn func()) {
		wg.Add(1)
		go func() { defer wg.Done(); fn() }()
	}
	goRun(func() { _ = m.probes.Run(ctx) })
	goRun(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case u := <-m.probes.Updates():
				m.wakePod(u.PodUID)
			}
		}
	})
	goRun(func() {
		t := m.clock.NewTicker(qosUpdatePeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
				if err := m.cgroups.updateQOS(m.activePods()); err != nil {
					klog.ErrorS(err, "Failed to update QoS cgroups")
				}
			}
		}
	})
	if m.trustBundles != nil {
		goRun(func() { _ = m.trustBundles.Run(ctx) })
	}
	if m.podCerts != nil {
		goRun(func() { m.watchPodCertificateRequests(ctx) })
	}
	if m.cfg.client != nil {
		goRun(func() { m.watchAPI(ctx) })
	} else {
		m.mu.Lock()
		m.apiSynced = true
		m.mu.Unlock()
	}
	if m.cfg.cfg.StaticPodPath != "" {
		goRun(func() { m.watchStatic(ctx) })
	} else {
		m.mu.Lock()
		m.staticLoaded = true
		m.mu.Unlock()
	}
	// The relist (the PLEG's job): wake the pods whose containers changed.
	t := m.clock.NewTicker(relistPeriod)
	defer t.Stop()
	for {
		m.relist(ctx)
		m.cfg.health.tick()
		select {
		case <-ctx.Done():
			m.wg.Wait()
			return nil
		case <-t.C():
		}
	}
}

// sourcesReady tells whether the API and static pod sources have loaded once (the
// kubelet's sourcesReady.AllReady).
func (m *podManager) sourcesReady() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.apiSynced && m.staticLoaded
}

// podContentRemovable tells the garbage collector whether what is left of the pod
// uid may go (ShouldPodContentBeRemoved): the sources have loaded and no source has
// the pod. A pod still known is removed by its own worker once it has terminated.
func (m *podManager) podContentRemovable(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.apiSynced || !m.staticLoaded {
		return false
	}
	_, known := m.pods[uid]
	return !known
}

// watchAPI feeds the pods bound to this node from an informer. As upstream's
// NewSourceApiserver, it starts only once this node's Node has been synced, so the
// first pods are admitted against the Node the API server has, not a guess.
func (m *podManager) watchAPI(ctx context.Context) {
	if m.cfg.node != nil && !m.cfg.node.nodeHasSynced() {
		klog.InfoS("Waiting for node sync before watching apiserver pods")
		t := time.NewTicker(time.Second)
		for !m.cfg.node.nodeHasSynced() {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				klog.V(4).InfoS("node sync has not completed yet")
			}
		}
		t.Stop()
		klog.V(4).InfoS("node sync completed")
	}
	klog.InfoS("Watching apiserver")
	// One informer, not a SharedInformerFactory (which links every API group's).
	inf := coreinformers.NewFilteredPodInformer(m.cfg.client, metav1.NamespaceAll, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", m.cfg.nodeName).String()
		})
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.apiPod(obj) },
		UpdateFunc: func(_, obj any) { m.apiPod(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok && !isMirror(p) {
				m.removePod(p.UID)
			}
		},
	})
	if err != nil {
		klog.ErrorS(err, "Failed to watch the pods bound to this node")
		return
	}
	m.status.setLister(inf.GetStore())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		inf.RunWithContext(ctx)
	}()
	// The handler's own sync, not the informer's: only once every listed pod has gone
	// through apiPod does the kubelet know all its pods, as upstream's sourcesReady
	// waits for the merged pod set. Until then nothing is treated as an orphan.
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		m.mu.Lock()
		m.apiSynced = true
		m.mu.Unlock()
	}
	<-ctx.Done()
	<-stopped
}

// mirrorCache answers the mirror pod reconciler's reads from the kubelet's own
// informers, on its Node and on the pods bound to it, as the kubelet's pod manager
// knows its mirror pods from its pod source; without it the reconciler would GET
// the Node and LIST the node's pods from the API server every 10 s. Until an
// informer has synced, that read goes to the API server.
type mirrorCache struct {
	m   *podManager
	api staticpod.Cache
}

func (c mirrorCache) Node(ctx context.Context, name string) (*corev1.Node, error) {
	if n := c.m.cfg.node; n != nil && n.nodes != nil && name == n.name && n.nodeHasSynced() {
		return n.nodes.Get(name)
	}
	return c.api.Node(ctx, name)
}

func (c mirrorCache) PodsOnNode(ctx context.Context, name string) ([]*corev1.Pod, error) {
	c.m.mu.Lock()
	synced := c.m.apiSynced
	c.m.mu.Unlock()
	c.m.status.mu.Lock()
	st := c.m.status.store
	c.m.status.mu.Unlock()
	if !synced || st == nil || name != c.m.cfg.nodeName {
		return c.api.PodsOnNode(ctx, name)
	}
	objs := st.List()
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

func isMirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[staticpod.AnnotationConfigMirror]
	return ok
}

func (m *podManager) apiPod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || isMirror(p) {
		return
	}
	m.upsert(p, false)
}

// watchStatic runs the static pods of staticPodPath and, with an API server, their
// mirror pods through staticpod's reconciler.
func (m *podManager) watchStatic(ctx context.Context) {
	w, err := staticpod.New(staticpod.Config{
		Dir: m.cfg.cfg.StaticPodPath, NodeName: m.cfg.nodeName,
		RescanPeriod: m.cfg.cfg.FileCheckFrequency.Duration, Ignore: staticpod.KubeletIgnore,
	})
	if err != nil {
		klog.ErrorS(err, "Static pod source unusable", "path", m.cfg.cfg.StaticPodPath)
		return
	}
	var mirrorEvents chan staticpod.Event
	var wg sync.WaitGroup
	defer wg.Wait()
	if m.cfg.client != nil {
		r, err := staticpod.NewReconciler(staticpod.ReconcilerConfig{
			Client: m.cfg.client, NodeName: m.cfg.nodeName,
			Cache: mirrorCache{m: m, api: staticpod.NewAPIServerCache(m.cfg.client)},
		})
		if err == nil {
			mirrorEvents = make(chan staticpod.Event, 16)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = r.Run(ctx, mirrorEvents)
			}()
		}
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	known := map[types.UID]bool{}
	for ev := range w.Events() {
		if ev.Err != nil {
			klog.ErrorS(ev.Err, "Static pod manifest skipped", "path", ev.Path)
		}
		now := map[types.UID]bool{}
		for _, p := range ev.Pods {
			now[p.UID] = true
			m.upsert(p, true)
		}
		for uid := range known {
			if !now[uid] {
				m.removePod(uid)
			}
		}
		known = now
		m.mu.Lock()
		m.staticLoaded = true
		m.mu.Unlock()
		if mirrorEvents != nil {
			select {
			case mirrorEvents <- ev:
			case <-ctx.Done():
			}
		}
	}
	if mirrorEvents != nil {
		close(mirrorEvents)
	}
}

// upsert records the newest copy of a pod and wakes its worker, starting one for a
// new pod.
func (m *podManager) upsert(p *corev1.Pod, static bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[p.UID]
	if ok {
		old := e.pod
		e.pod = p
		e.gone = false
		// Only a change the kubelet acts on wakes the worker, as the kubelet's pod
		// config does; its own status writes coming back through the informer do not.
		if !podChanged(old, p) {
			return
		}
		select {
		case e.wake <- struct{}{}:
		default:
		}
		return
	}
	if m.workerCtx == nil || m.workerCtx.Err() != nil {
		return
	}
	e = &podEntry{pod: p, static: static, wake: make(chan struct{}, 1), firstSeen: m.clock.Now(), done: make(chan struct{})}
	e.wake <- struct{}{}
	m.pods[p.UID] = e
	ctx := m.workerCtx
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.worker(ctx, e)
	}()
}

// podChanged reports whether an update changes what the kubelet acts on: spec,
// labels, annotations or the deletion fields (pkg/kubelet/config checkAndUpdatePod).
func podChanged(old, cur *corev1.Pod) bool {
	return !apiequality.Semantic.DeepEqual(old.Spec, cur.Spec) ||
		!apiequality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
		!apiequality.Semantic.DeepEqual(old.Annotations, cur.Annotations) ||
		!apiequality.Semantic.DeepEqual(old.DeletionTimestamp, cur.DeletionTimestamp) ||
		!apiequality.Semantic.DeepEqual(old.DeletionGracePeriodSeconds, cur.DeletionGracePeriodSeconds)
}

func (m *podManager) removePod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.pods[uid]; ok {
		e.gone = true
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

func (m *podManager) wakePod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.pods[uid]; ok {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// worker serializes the syncs of one pod, as the kubelet's pod worker does: on
// every wake-up, after a failed sync (workerBackOffPeriod) and every syncFrequency.
func (m *podManager) worker(ctx context.Context, e *podEntry) {
	defer close(e.done)
	var timer clock.Timer
	for {
		var timerC <-chan time.Time
		if timer != nil {
			timerC = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-timerC:
		}
		if timer != nil {
			timer.Stop()
		}
		finished, err := m.syncPod(ctx, e)
		if finished {
			return
		}
		if err != nil && ctx.Err() == nil {
			pod, _ := m.snapshot(e)
			klog.ErrorS(err, "Error syncing pod, skipping", "pod", klog.KObj(pod), "podUID", pod.UID)
		}
		next := m.cfg.cfg.SyncFrequency.Duration
		if err != nil {
			next = workerBackOffPeriod
		}
		timer = m.clock.NewTimer(next)
	}
}

func (m *podManager) snapshot(e *podEntry) (*corev1.Pod, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return e.pod, e.gone
}

// syncPod does one round for a pod; finished is true once the pod is gone from the
// node (its worker ends).
func (m *podManager) syncPod(ctx context.Context, e *podEntry) (finished bool, err error) {
	pod, gone := m.snapshot(e)
	start := m.clock.Now()
	op := "sync"
	if !e.admitted && !e.rejected {
		op = "create"
	}
	defer func() { podWorkerDuration.WithLabelValues(op).Observe(m.clock.Since(start).Seconds()) }()

	if gone {
		return m.terminate(ctx, e, pod, true)
	}
	if pod.DeletionTimestamp != nil {
		return m.terminate(ctx, e, pod, false)
	}
	if req := m.evicting(e); req != nil {
		return m.syncEvicted(ctx, e, pod, req)
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		// Terminal: make sure nothing runs; the status stays as written.
		view, err := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, nil)
		if err == nil && hasRunning(view) {
			m.syncer.KillPod(ctx, pod, view, nil)
		}
		m.probes.RemovePod(pod)
		return false, nil
	}
	if !e.admitted {
		if e.rejected {
			return false, nil
		}
		// A pod admitted before a restart is admitted again with its checkpointed
		// allocation, not a resize still pending in its spec (AddPod).
		allocated, _ := m.alloc.pod(pod)
		if reason, msg, ok := m.admit(allocated); !ok {
			e.rejected = true
			m.events.Eventf(pod, corev1.EventTypeWarning, reason, "%s", msg)
			st := pod.Status.DeepCopy()
			st.Phase, st.Reason, st.Message = corev1.PodFailed, reason, "Pod was rejected: "+msg
			m.status.write(ctx, pod, e.static, st)
			return false, nil
		}
		m.alloc.set(allocated)
		m.alloc.backfill(pod)
		m.mu.Lock()
		e.admitted = true
		m.mu.Unlock()
		if err := m.probes.AddPod(pod); err != nil {
			klog.ErrorS(err, "Probes not started", "pod", klog.KObj(pod))
		}
	}
	if m.syncer.ActiveDeadlineExceeded(pod) {
		m.events.Eventf(pod, corev1.EventTypeNormal, podsync.ReasonDeadlineExceeded, "Pod was active on the node longer than the specified deadline")
		view, _ := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, nil)
		m.syncer.KillPod(ctx, pod, view, nil)
		st := m.computeStatus(ctx, pod, true)
		st.Phase, st.Reason, st.Message = corev1.PodFailed, podsync.ReasonDeadlineExceeded, podsync.MessageDeadlineExceeded
		m.setStatus(e, st)
		m.status.write(ctx, pod, e.static, st)
		return false, nil
	}

	statusPod := pod
	// From here on the pod runs with what it was allocated (an in-place resize
	// the node cannot fit yet stays pending).
	pod = m.handleResize(pod)
	// One read of the runtime serves the pod cgroup check and the sync, as the
	// kubelet's pod worker syncs with the pod status it read before; with
	// termination messages, so that it can also serve the status.
	view, err := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, podsync.OSFiles{})
	if err != nil {
		return false, fmt.Errorf("read runtime state of pod %s: %w", podDesc(pod), err)
	}
	if view, err = m.ensurePodCgroup(ctx, pod, view); err != nil {
		return false, err
	}
	if err := m.volumes.Setup(ctx, pod); err != nil {
		m.events.Eventf(pod, corev1.EventTypeWarning, "FailedMount", "%s", err.Error())
		st := m.computeStatus(ctx, pod, false)
		m.setStatus(e, st)
		m.status.write(ctx, pod, e.static, st)
		return false, err
	}
	m.pullSecrets.refresh(ctx, pod)
	res := m.syncer.SyncPod(ctx, pod, view)
	// A sync that changed nothing in the runtime leaves the view as it was: the
	// status comes from it, as the kubelet's comes from the pod status it synced
	// with (a change since is the relist's to report). Otherwise one read after the
	// sync serves both the resize progress and the status; each read is a list and
	// a status call per sandbox and container.
	after := view
	if len(res.Steps) > 0 || res.Err != nil {
		if after, err = podsync.LoadView(ctx, m.cfg.runtime, pod.UID, podsync.OSFiles{}); err != nil {
			after = nil
		}
	}
	m.resizeProgress(pod, after, res)
	st := m.statusFromView(pod, after, false)
	m.setStatus(e, st)
	if !e.started && st.Phase == corev1.PodRunning {
		e.started = true
		podStartDuration.Observe(m.clock.Since(e.firstSeen).Seconds())
	}
	m.status.write(ctx, statusPod, e.static, st)
	if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		// Done for good (restartPolicy Never/OnFailure): stop the sandbox, keep the
		// containers for their status and logs.
		view, _ := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, nil)
		m.syncer.KillPod(ctx, pod, view, nil)
		m.probes.RemovePod(pod)
	}
	return false, res.Error()
}

func hasRunning(v *podsync.PodView) bool {
	if v == nil {
		return false
	}
	for _, c := range v.Containers {
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return true
		}
	}
	for _, s := range v.Sandboxes {
		if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			return true
		}
	}
	return false
}

func (m *podManager) computeStatus(ctx context.Context, pod *corev1.Pod, terminal bool) *corev1.PodStatus {
	view, err := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, podsync.OSFiles{})
	if err != nil {
		view = nil
	}
	return m.statusFromView(pod, view, terminal)
}

// statusFromView is computeStatus on a view already read (with podsync.OSFiles, for
// termination messages); nil means the runtime could not be read.
func (m *podManager) statusFromView(pod *corev1.Pod, view *podsync.PodView, terminal bool) *corev1.PodStatus {
	if view == nil {
		view = &podsync.PodView{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace}
	}
	if terminal {
		// determinePodResizeStatus: a pod that will not run again has no resize.
		m.alloc.clearPending(pod.UID)
		m.alloc.clearInProgress(pod.UID)
	}
	st := m.syncer.PodStatus(pod, view, podsync.StatusInput{HostIPs: m.hostIPs, Terminal: terminal,
		ResizeConditions: m.alloc.conditions(pod.UID)})
	m.probes.UpdatePodStatus(pod, &st)
	return &st
}

func (m *podManager) setStatus(e *podEntry, st *corev1.PodStatus) {
	m.mu.Lock()
	e.status = st.DeepCopy()
	m.mu.Unlock()
}

// terminate kills a pod being deleted (or gone), writes its final status and, for an
// API pod being deleted gracefully, makes the final delete with a UID precondition.
func (m *podManager) terminate(ctx context.Context, e *podEntry, pod *corev1.Pod, gone bool) (bool, error) {
	m.probes.StopLivenessAndStartup(pod)
	view, err := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, nil)
	if err != nil {
		return false, err
	}
	var grace *int64
	if pod.DeletionGracePeriodSeconds != nil {
		grace = pod.DeletionGracePeriodSeconds
	}
	if res := m.syncer.KillPod(ctx, pod, view, grace); res.Error() != nil {
		return false, res.Error()
	}
	if !gone {
		st := m.computeStatus(ctx, pod, true)
		m.status.write(ctx, pod, e.static, st)
		if !e.static && m.cfg.client != nil {
			uid := pod.UID
			err := m.cfg.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
				GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid},
			})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return false, fmt.Errorf("delete pod %s: %w", podDesc(pod), err)
			}
			// The informer's delete event removes the pod from the node.
			return false, nil
		}
	}
	m.probes.RemovePod(pod)
	if err := m.syncer.RemovePod(ctx, pod.UID); err != nil {
		return false, err
	}
	if err := m.volumes.Teardown(ctx, pod.UID); err != nil {
		// Never remove the pod's folder while a volume may still be mounted in it: a
		// tmpfs or a subPath bind of a hostPath would take the host's files with it.
		// The next sync of this pod tries again.
		klog.ErrorS(err, "Volume teardown failed", "pod", klog.KObj(pod))
		return false, fmt.Errorf("tear down volumes of pod %s: %w", podDesc(pod), err)
	}
	// The pod cgroup goes after the volumes, as upstream keeps it while they exist
	// (a tmpfs emptyDir's memory is charged to it).
	if err := m.cgroups.removePod(pod.UID); err != nil {
		// The relist's sweep of orphan pod cgroups tries again.
		klog.ErrorS(err, "Failed to remove the pod cgroup", "pod", klog.KObj(pod))
	}
	_ = os.RemoveAll(filepath.Join(m.cfg.rootDir, "pods", string(pod.UID)))
	_ = os.RemoveAll(cri.PodLogsDirectory(m.cfg.cfg.PodLogsDir, pod))
	m.status.forget(pod.UID)
	m.pullSecrets.forget(pod.UID)
	m.alloc.forget(pod.UID)
	m.mu.Lock()
	delete(m.pods, pod.UID)
	m.mu.Unlock()
	klog.V(2).InfoS("Pod removed from the node", "pod", klog.KObj(pod))
	m.retryPendingResizes()
	return true, nil
}

// relist lists the runtime's sandboxes and containers once, updates the running
// gauges, wakes workers of pods whose state changed, and (once the pod sources have
// loaded) removes sandboxes of pods that are no longer bound here.
func (m *podManager) relist(ctx context.Context) {
	sandboxes, err := m.cfg.runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return
	}
	containers, err := m.cfg.runtime.ListContainers(ctx, nil)
	if err != nil {
		return
	}
	fp := map[types.UID]string{}
	running := 0
	states := map[string]float64{}
	for _, s := range sandboxes {
		uid := types.UID(s.GetLabels()[cri.LabelPodUID])
		fp[uid] += fmt.Sprintf("s%s:%d;", s.GetId(), s.GetState())
		if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			running++
		}
	}
	for _, c := range containers {
		uid := types.UID(c.GetLabels()[cri.LabelPodUID])
		fp[uid] += fmt.Sprintf("c%s:%d;", c.GetId(), c.GetState())
		states[containerStateLabel(c.GetState())]++
	}
	runningPods.Set(float64(running))
	for _, s := range []string{"created", "running", "exited", "unknown"} {
		runningContainers.WithLabelValues(s).Set(states[s])
	}
	m.mu.Lock()
	var wake []types.UID
	for uid, f := range fp {
		if m.fingerprints[uid] != f {
			wake = append(wake, uid)
		}
	}
	m.fingerprints = fp
	var orphans []*runtimeapi.PodSandbox
	if m.apiSynced && m.staticLoaded {
		for _, s := range sandboxes {
			if _, ok := m.pods[types.UID(s.GetLabels()[cri.LabelPodUID])]; !ok {
				orphans = append(orphans, s)
			}
		}
	}
	var orphanCgroups []types.UID
	if m.apiSynced && m.staticLoaded {
		// Resize records of pods no longer on the node (RemoveOrphanedPods, and
		// the runtime manager's pass over its actuated state), under m.mu so a
		// pod arriving meanwhile keeps its own.
		m.removeOrphanRecords()
		for uid := range m.cgroups.podCgroupsOnNode() {
			// As the kubelet's cleanupOrphanedPodCgroups: not while the pod's volumes
			// are still on the node.
			if _, known := m.pods[uid]; !known && fp[uid] == "" && !dirExists(filepath.Join(m.cfg.rootDir, "pods", string(uid), "volumes")) {
				orphanCgroups = append(orphanCgroups, uid)
			}
		}
	}
	sourcesReady := m.apiSynced && m.staticLoaded
	m.mu.Unlock()
	if sourcesReady {
		wake = append(wake, m.alloc.takeAwaitingSources()...)
	}
	for _, uid := range wake {
		m.wakePod(uid)
	}
	m.removeOrphans(ctx, orphans)
	// Pod cgroups of pods gone from the node (the kubelet's
	// cleanupOrphanedPodCgroups), for pods whose sandboxes are gone too.
	for _, uid := range orphanCgroups {
		m.mu.Lock()
		// A pod with this UID may have arrived since (a static manifest restored):
		// its cgroup is its own again. Held while removing, so it cannot arrive midway.
		if _, known := m.pods[uid]; !known {
			klog.V(2).InfoS("Removing the cgroup of a pod no longer on this node", "podUID", uid)
			if err := m.cgroups.removePod(uid); err != nil {
				klog.ErrorS(err, "Failed to remove an orphan pod cgroup", "podUID", uid)
			}
		}
		m.mu.Unlock()
	}
}

// removeOrphanRecords drops the allocated and actuated records of pods not
// on the node, in memory: the next write leaves them out, as upstream's. The
// caller holds m.mu.
func (m *podManager) removeOrphanRecords() {
	known := func(uid types.UID) bool { _, ok := m.pods[uid]; return ok }
	m.alloc.allocated.removeOrphans(known)
	m.actuated.removeOrphans(known)
}

// ensurePodCgroup makes the pod's cgroup as the kubelet's SyncPod does: a pod
// whose containers already run without one (started before the QoS hierarchy
// existed) is killed first so that it restarts inside it, and a killed
// restartPolicy Never pod gets no cgroup (it will not run again).
//
// view is the runtime's state of the pod; the state after a kill is returned.
func (m *podManager) ensurePodCgroup(ctx context.Context, pod *corev1.Pod, view *podsync.PodView) (*podsync.PodView, error) {
	if !m.cgroups.perQOS || m.cgroups.exists(m.cgroups.podName(pod)) {
		return view, nil
	}
	if anyContainerRunning(view) {
		klog.InfoS("Pod runs outside its pod cgroup; killing it to restart it inside", "pod", klog.KObj(pod), "cgroup", m.cgroups.podName(pod))
		res := m.syncer.KillPod(ctx, pod, view, nil)
		killed, err := podsync.LoadView(ctx, m.cfg.runtime, pod.UID, podsync.OSFiles{})
		if err != nil {
			return nil, fmt.Errorf("read runtime state of pod %s: %w", podDesc(pod), err)
		}
		view = killed
		if res.Error() == nil && pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			return view, nil
		}
	}
	if err := m.cgroups.ensurePod(pod, m.activePods()); err != nil {
		m.events.Eventf(pod, corev1.EventTypeWarning, "FailedCreatePodContainer", "unable to ensure pod container exists: %v", err)
		return nil, fmt.Errorf("failed to ensure that the pod: %v cgroups exist and are correctly applied: %w", pod.UID, err)
	}
	return view, nil
}

func anyContainerRunning(v *podsync.PodView) bool {
	for _, c := range v.Containers {
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return true
		}
	}
	return false
}

// activePods are the pods the QoS cgroups account for: admitted, still bound
// here and not terminal (the kubelet's active pods).
func (m *podManager) activePods() []*corev1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(m.pods))
	for _, e := range m.pods {
		if e.gone || e.rejected {
			continue
		}
		phase := e.pod.Status.Phase
		if e.status != nil {
			phase = e.status.Phase
		}
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			continue
		}
		out = append(out, e.pod)
	}
	return out
}

// removeOrphans stops and removes the sandboxes (and containers) of pods no source
// knows: pods deleted while the kubelet was down.
func (m *podManager) removeOrphans(ctx context.Context, orphans []*runtimeapi.PodSandbox) {
	done := map[types.UID]bool{}
	for _, s := range orphans {
		uid := types.UID(s.GetLabels()[cri.LabelPodUID])
		if done[uid] {
			continue
		}
		done[uid] = true
		klog.InfoS("Removing sandboxes of a pod no longer bound to this node", "podUID", uid,
			"pod", klog.KRef(s.GetMetadata().GetNamespace(), s.GetMetadata().GetName()))
		for _, other := range orphans {
			if types.UID(other.GetLabels()[cri.LabelPodUID]) == uid {
				if err := m.cfg.runtime.StopPodSandbox(ctx, other.GetId()); err != nil && !errors.Is(err, cri.ErrNotFound) {
					klog.ErrorS(err, "Stop orphan sandbox", "sandbox", other.GetId())
				}
			}
		}
		if err := m.syncer.RemovePod(ctx, uid); err != nil {
			klog.ErrorS(err, "Remove orphan pod", "podUID", uid)
		}
		_ = m.volumes.Teardown(ctx, uid)
	}
}

func containerStateLabel(s runtimeapi.ContainerState) string {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return "created"
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return "running"
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return "exited"
	}
	return "unknown"
}

// eventAdapter turns the agent's event needs (pod events, probe events with the
// container's field path) into client-go recorder calls.
type eventAdapter struct{ recorder record.EventRecorder }

func (a *eventAdapter) Eventf(pod *corev1.Pod, eventType, reason, format string, args ...any) {
	if a.recorder != nil {
		a.recorder.Eventf(pod, eventType, reason, format, args...)
	}
}

// Event is probe.EventRecorder: the event is about the container
// (fieldPath spec.containers{name}), as the kubelet's prober records it.
func (a *eventAdapter) Event(pod *corev1.Pod, container, eventType, reason, message string) {
	if a.recorder == nil {
		return
	}
	ref, err := reference.GetReference(scheme.Scheme, pod)
	if err != nil {
		a.recorder.Event(pod, eventType, reason, message)
		return
	}
	ref.FieldPath = fieldPath(pod, container)
	a.recorder.Event(ref, eventType, reason, message)
}

func fieldPath(pod *corev1.Pod, container string) string {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == container {
			return fmt.Sprintf("spec.initContainers{%s}", container)
		}
	}
	return fmt.Sprintf("spec.containers{%s}", container)
}

// emptyEnvSource serves standalone mode: no API objects exist.
type emptyEnvSource struct{}

func (emptyEnvSource) ConfigMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return nil, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
}

func (emptyEnvSource) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
}

func (emptyEnvSource) Services(context.Context, string) ([]*corev1.Service, error) { return nil, nil }
