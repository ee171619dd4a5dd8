package staticpod

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// MirrorPod returns the mirror pod the kubelet posts for a static pod: a copy with
// annotation kubernetes.io/config.mirror set to the static pod's config.hash and a
// single controller owner reference to the Node (NodeRestriction refuses a mirror pod
// without it). The node must carry its UID, as read from the API server.
func MirrorPod(static *corev1.Pod, node *corev1.Node) *corev1.Pod {
	m := static.DeepCopy()
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[AnnotationConfigMirror] = static.Annotations[AnnotationConfigHash]
	controller := true
	m.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1",
		Kind:       "Node",
		Name:       node.Name,
		UID:        node.UID,
		Controller: &controller,
	}}
	return m
}

// IsMirrorOf reports whether mirror is the current mirror pod of static: same
// namespace and name, and its config.mirror annotation equals static's config.hash.
func IsMirrorOf(mirror, static *corev1.Pod) bool {
	if mirror.Namespace != static.Namespace || mirror.Name != static.Name {
		return false
	}
	h, ok := mirror.Annotations[AnnotationConfigMirror]
	return ok && h == static.Annotations[AnnotationConfigHash]
}

// DefaultResyncPeriod is how often Reconciler.Run re-checks the API server without
// a new event.
const DefaultResyncPeriod = 10 * time.Second

// ReconcilerConfig configures NewReconciler. Client and NodeName are required.
type ReconcilerConfig struct {
	// Client talks to the API server as the node (user system:node:<NodeName>, group
	// system:nodes), which the Node authorizer and NodeRestriction allow to create,
	// read and delete exactly this node's mirror pods.
	Client kubernetes.Interface
	// NodeName is the node the static pods run on.
	NodeName string
	// Clock drives Run's resync. Default: real clock.
	Clock clock.WithTicker
	// ResyncPeriod: Run syncs at least this often. Default DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// Metrics counts API operations. Default: no-op.
	Metrics Metrics
	// Cache, when set, answers Sync's two reads (the Node, and the pods bound to
	// it) from copies the caller already keeps, such as a kubelet's informers on
	// its own Node and pods. Default: nil, and every Sync GETs the Node and LISTs
	// the node's pods from the API server, which every ResyncPeriod is a load a
	// kubelet with 110 pods should not put on it.
	Cache Cache
}

// Cache is what Sync reads when ReconcilerConfig.Cache is set. Sync only reads
// what it returns (objects from an informer's store may be shared). It may lag the
// API server: a mirror pod it still shows after it was replaced, or does not show
// yet after it was created, costs one more request in Sync (a delete that meets
// Conflict or NotFound, a create that meets AlreadyExists and adopts the pod),
// never a wrong outcome.
type Cache interface {
	// Node returns the Node named name, or an error for which apierrors.IsNotFound
	// holds if it does not exist (yet).
	Node(ctx context.Context, name string) (*corev1.Node, error)
	// PodsOnNode returns the pods whose spec.nodeName is name.
	PodsOnNode(ctx context.Context, name string) ([]*corev1.Pod, error)
}

// NewAPIServerCache returns the Cache a Reconciler without one reads: the API
// server itself, a GET of the Node and a LIST of the node's pods (field selector
// spec.nodeName) per call. A caller's own Cache can fall back to it while its
// informers have not synced.
func NewAPIServerCache(client kubernetes.Interface) Cache { return apiCache{client: client} }

// apiCache is NewAPIServerCache's Cache.
type apiCache struct{ client kubernetes.Interface }

func (a apiCache) Node(ctx context.Context, name string) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (a apiCache) PodsOnNode(ctx context.Context, name string) ([]*corev1.Pod, error) {
	list, err := a.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String(),
	})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// Reconciler makes the API server's mirror pods match a node's static pods.
type Reconciler struct {
	cfg ReconcilerConfig
}

// NewReconciler validates cfg.
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: Client is required", ErrInvalidConfig)
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("%w: NodeName is required", ErrInvalidConfig)
	}
	if cfg.ResyncPeriod < 0 {
		return nil, fmt.Errorf("%w: ResyncPeriod %v is negative", ErrInvalidConfig, cfg.ResyncPeriod)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ResyncPeriod == 0 {
		cfg.ResyncPeriod = DefaultResyncPeriod
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noopMetrics{}
	}
	if cfg.Cache == nil {
		cfg.Cache = apiCache{client: cfg.Client}
	}
	return &Reconciler{cfg: cfg}, nil
}

// Sync makes one pass, like the kubelet's mirror pod handling:
//
//   - a static pod without a mirror pod gets one (MirrorPod); AlreadyExists from a
//     mirror pod with the same hash counts as success;
//   - a mirror pod whose hash differs, or that is being deleted, is deleted with a
//     precondition on its UID (so a newer pod of the same name is never removed by
//     mistake) and grace period 0, then created again: mirror pods are replaced,
//     never patched, as the kubelet does;
//   - a mirror pod on this node whose static pod is gone is deleted the same way;
//   - a pod of the same name that is not a mirror pod is left alone and reported.
//
// Nothing is created while the Node is missing or being deleted. Every failure is
// collected; the error joins them, each matching ErrMirrorPod and naming its pod, and
// keeps the API error inside for apierrors checks.
func (r *Reconciler) Sync(ctx context.Context, pods []*corev1.Pod) error {
	log := logr.FromContextOrDiscard(ctx)
	node, err := r.cfg.Cache.Node(ctx, r.cfg.NodeName)
	if err != nil {
		return fmt.Errorf("%w: get node %s: %w", ErrMirrorPod, r.cfg.NodeName, err)
	}
	onNode, err := r.cfg.Cache.PodsOnNode(ctx, r.cfg.NodeName)
	if err != nil {
		return fmt.Errorf("%w: list pods of node %s: %w", ErrMirrorPod, r.cfg.NodeName, err)
	}
	existing := map[types.NamespacedName]*corev1.Pod{}
	for _, p := range onNode {
		existing[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
	}

	var errs []error
	wanted := map[types.NamespacedName]bool{}
	for _, static := range pods {
		key := types.NamespacedName{Namespace: static.Namespace, Name: static.Name}
		wanted[key] = true
		cur := existing[key]
		if cur != nil && !isMirror(cur) {
			errs = append(errs, fmt.Errorf("%w: %s exists and is not a mirror pod; leaving it alone", ErrMirrorPod, key))
			continue
		}
		if cur != nil && cur.DeletionTimestamp == nil && IsMirrorOf(cur, static) {
			continue
		}
		if cur != nil {
			log.V(0).Info("Replacing mirror pod that does not match its static pod", "pod", key.String(), "uid", cur.UID)
			if err := r.delete(ctx, cur); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if node.DeletionTimestamp != nil {
			log.V(0).Info("Node is being deleted; not creating mirror pod", "pod", key.String())
			continue
		}
		if err := r.create(ctx, static, node); err != nil {
			errs = append(errs, err)
		}
	}

	var orphans []*corev1.Pod
	for key, p := range existing {
		if isMirror(p) && !wanted[key] {
			orphans = append(orphans, p)
		}
	}
	sort.Slice(orphans, func(i, j int) bool {
		return orphans[i].Namespace+"/"+orphans[i].Name < orphans[j].Namespace+"/"+orphans[j].Name
	})
	for _, p := range orphans {
		log.V(0).Info("Deleting mirror pod whose static pod is gone", "pod", p.Namespace+"/"+p.Name, "uid", p.UID)
		if err := r.delete(ctx, p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isMirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[AnnotationConfigMirror]
	return ok
}

func (r *Reconciler) create(ctx context.Context, static *corev1.Pod, node *corev1.Node) error {
	m := MirrorPod(static, node)
	pods := r.cfg.Client.CoreV1().Pods(m.Namespace)
	_, err := pods.Create(ctx, m, metav1.CreateOptions{})
	if err == nil {
		r.cfg.Metrics.IncMirrorOp("create", false)
		logr.FromContextOrDiscard(ctx).V(0).Info("Created mirror pod", "pod", m.Namespace+"/"+m.Name)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		r.cfg.Metrics.IncMirrorOp("create", true)
		return fmt.Errorf("%w: create %s/%s: %w", ErrMirrorPod, m.Namespace, m.Name, err)
	}
	// Someone (an earlier attempt, a restarted agent) created it already: fine if it
	// carries the same hash. Otherwise the next Sync replaces it.
	cur, getErr := pods.Get(ctx, m.Name, metav1.GetOptions{})
	if getErr == nil && IsMirrorOf(cur, static) && cur.DeletionTimestamp == nil {
		r.cfg.Metrics.IncMirrorOp("adopt", false)
		return nil
	}
	r.cfg.Metrics.IncMirrorOp("create", true)
	if getErr != nil {
		return fmt.Errorf("%w: create %s/%s: %w (and reading it back failed: %v)", ErrMirrorPod, m.Namespace, m.Name, err, getErr)
	}
	return fmt.Errorf("%w: create %s/%s: a pod of that name with another hash exists (uid %s): %w", ErrMirrorPod, m.Namespace, m.Name, cur.UID, err)
}

// delete removes a mirror pod at once, only if it still has the UID we saw. NotFound
// (already gone) and Conflict (the UID changed: a newer pod took the name) are not
// errors.
func (r *Reconciler) delete(ctx context.Context, p *corev1.Pod) error {
	uid := p.UID
	zero := int64(0)
	err := r.cfg.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		r.cfg.Metrics.IncMirrorOp("delete", false)
		return nil
	}
	r.cfg.Metrics.IncMirrorOp("delete", true)
	return fmt.Errorf("%w: delete %s/%s (uid %s): %w", ErrMirrorPod, p.Namespace, p.Name, uid, err)
}

// Run syncs the mirror pods with the set carried by each event from a Watcher (every
// event's Pods is the whole current set) and again every ResyncPeriod, until ctx ends
// or events closes. Failures are logged and retried on the next event or resync; Run
// returns nil.
func (r *Reconciler) Run(ctx context.Context, events <-chan Event) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("node", r.cfg.NodeName)
	ctx = logr.NewContext(ctx, log)
	ticker := r.cfg.Clock.NewTicker(r.cfg.ResyncPeriod)
	defer ticker.Stop()
	var pods []*corev1.Pod
	haveSet := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			pods, haveSet = ev.Pods, true
		case <-ticker.C():
			if !haveSet {
				continue
			}
		}
		if err := r.Sync(ctx, pods); err != nil && ctx.Err() == nil {
			log.Error(err, "Mirror pod sync failed; will retry")
		}
	}
}
