package servicemap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Errors returned by NewWatcher and Run.
var (
	ErrInvalidConfig  = errors.New("servicemap: invalid config")
	ErrAlreadyStarted = errors.New("servicemap: watcher already started")
)

// Handler receives Service and EndpointSlice events. *Tracker implements it.
type Handler interface {
	OnServiceAdd(svc *v1.Service)
	OnServiceUpdate(oldSvc, svc *v1.Service)
	OnServiceDelete(svc *v1.Service)
	OnEndpointSliceAdd(es *discovery.EndpointSlice)
	OnEndpointSliceUpdate(oldES, es *discovery.EndpointSlice)
	OnEndpointSliceDelete(es *discovery.EndpointSlice)
}

var _ Handler = (*Tracker)(nil)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// Handler receives the events, usually a *Tracker. Required.
	Handler Handler
	// ResyncPeriod is accepted for kube-proxy's configSyncPeriod and validated,
	// but the Watcher keeps no copy of the objects to replay (see Watcher): a
	// replay would hand the Tracker objects it already holds, which it ignores.
	ResyncPeriod time.Duration
}

// Watcher lists and watches Services and EndpointSlices with kube-proxy's filters
// and feeds a Handler:
//
//   - Services: label selector "!service.kubernetes.io/service-proxy-name" and field
//     selector "spec.clusterIP!=None" (headless Services are left to DNS).
//   - EndpointSlices: label selector "!service.kubernetes.io/headless".
//
// Unlike kube-proxy's informers, it keeps no cache of the objects: a client-go
// Reflector per resource hands each listed or watched object straight to the
// Handler, which keeps what it needs (the Tracker its compact form), and the
// Watcher remembers only each object's namespace and name, to tell an add from
// an update and to find the objects a re-list no longer contains. At 10,000
// Services with 10 endpoints each the informer caches held about 35 MB that
// duplicated the Tracker. In exchange, the old object an update passes is a
// stub with the namespace and name alone, deletes found by a re-list pass such
// a stub too, and there is no periodic replay.
type Watcher struct {
	handler Handler
	client  kubernetes.Interface
	synced  chan struct{}
	startMu sync.Mutex
	started bool
}

// Selectors kube-proxy lists with (exported for tools that list the same objects).
var (
	ServiceLabelSelector       = mustNotExist(LabelServiceProxyName)
	ServiceFieldSelector       = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
	EndpointSliceLabelSelector = mustNotExist(LabelHeadless)
)

func mustNotExist(key string) string {
	r, err := labels.NewRequirement(key, selection.DoesNotExist, nil)
	if err != nil {
		// Both keys are constants that are valid label keys.
		return "!" + key
	}
	return labels.NewSelector().Add(*r).String()
}

// NewWatcher validates cfg; Run starts watching.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: Client is required", ErrInvalidConfig)
	}
	if cfg.Handler == nil {
		return nil, fmt.Errorf("%w: Handler is required", ErrInvalidConfig)
	}
	if cfg.ResyncPeriod < 0 {
		return nil, fmt.Errorf("%w: ResyncPeriod %v is negative", ErrInvalidConfig, cfg.ResyncPeriod)
	}
	return &Watcher{handler: cfg.Handler, client: cfg.Client, synced: make(chan struct{})}, nil
}

// Synced is closed once the initial lists of Services and EndpointSlices have
// been delivered to the Handler.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Run watches until ctx ends, then stops the reflectors and waits for their
// goroutines. It returns nil when ctx ended, or ErrAlreadyStarted on a second call.
func (w *Watcher) Run(ctx context.Context) error {
	w.startMu.Lock()
	if w.started {
		w.startMu.Unlock()
		return ErrAlreadyStarted
	}
	w.started = true
	w.startMu.Unlock()
	log := logr.FromContextOrDiscard(ctx).WithName("servicemap")

	svcs := &handoffStore[*v1.Service]{
		newStub: func(nn types.NamespacedName) *v1.Service {
			return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
		},
		add: w.handler.OnServiceAdd, update: w.handler.OnServiceUpdate, remove: w.handler.OnServiceDelete,
	}
	eps := &handoffStore[*discovery.EndpointSlice]{
		newStub: func(nn types.NamespacedName) *discovery.EndpointSlice {
			return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
		},
		add: w.handler.OnEndpointSliceAdd, update: w.handler.OnEndpointSliceUpdate, remove: w.handler.OnEndpointSliceDelete,
	}
	svcStore, epsStore := svcs.init(), eps.init()
	services := w.client.CoreV1().Services(metav1.NamespaceAll)
	slices := w.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	svcSel := func(o *metav1.ListOptions) {
		o.LabelSelector = ServiceLabelSelector
		o.FieldSelector = ServiceFieldSelector
	}
	epsSel := func(o *metav1.ListOptions) { o.LabelSelector = EndpointSliceLabelSelector }
	reflectors := []*cache.Reflector{
		cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				svcSel(&o)
				return services.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				svcSel(&o)
				return services.Watch(ctx, o)
			},
		}, w.client), &v1.Service{}, svcStore, cache.ReflectorOptions{Name: "servicemap Services"}),
		cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				epsSel(&o)
				return slices.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				epsSel(&o)
				return slices.Watch(ctx, o)
			},
		}, w.client), &discovery.EndpointSlice{}, epsStore, cache.ReflectorOptions{Name: "servicemap EndpointSlices"}),
	}
	var wg sync.WaitGroup
	for _, r := range reflectors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.RunWithContext(ctx)
		}()
	}
	defer wg.Wait()
	log.V(4).Info("Waiting for the initial lists of Services and EndpointSlices")
	for _, st := range []*handoff{svcStore, epsStore} {
		select {
		case <-ctx.Done():
			return nil
		case <-st.listed:
		}
	}
	log.Info("Services and EndpointSlices synced")
	close(w.synced)
	<-ctx.Done()
	return nil
}

// handoffStore turns a Reflector's store calls into Handler calls for objects
// of type T, remembering only which objects exist.
type handoffStore[T metav1.Object] struct {
	newStub     func(types.NamespacedName) T
	add, remove func(T)
	update      func(old, obj T)
	known       map[types.NamespacedName]struct{}
}

// handoff is the cache.ReflectorStore of a handoffStore; listed is closed after
// the first Replace (the initial list) has been handed over.
type handoff struct {
	add, update, remove func(any) error
	replace             func([]any) error
	listed              chan struct{}
	once                sync.Once
}

func (h *handoff) Add(obj any) error    { return h.add(obj) }
func (h *handoff) Update(obj any) error { return h.update(obj) }
func (h *handoff) Delete(obj any) error { return h.remove(obj) }
func (h *handoff) Replace(list []any, _ string) error {
	err := h.replace(list)
	h.once.Do(func() { close(h.listed) })
	return err
}

// Resync has nothing to replay: no objects are kept.
func (h *handoff) Resync() error { return nil }

// init builds the store the Reflector calls; the Reflector calls it from one
// goroutine, so known needs no lock.
func (s *handoffStore[T]) init() *handoff {
	s.known = map[types.NamespacedName]struct{}{}
	typed := func(obj any) (T, types.NamespacedName, error) {
		t, ok := obj.(T)
		if !ok {
			var zero T
			return zero, types.NamespacedName{}, fmt.Errorf("servicemap: unexpected object of type %T", obj)
		}
		return t, types.NamespacedName{Namespace: t.GetNamespace(), Name: t.GetName()}, nil
	}
	set := func(obj any) error {
		t, nn, err := typed(obj)
		if err != nil {
			return err
		}
		if _, ok := s.known[nn]; ok {
			s.update(s.newStub(nn), t)
			return nil
		}
		s.known[nn] = struct{}{}
		s.add(t)
		return nil
	}
	return &handoff{
		listed: make(chan struct{}),
		add:    set,
		update: set,
		remove: func(obj any) error {
			t, nn, err := typed(obj)
			if err != nil {
				return err
			}
			delete(s.known, nn)
			s.remove(t)
			return nil
		},
		replace: func(list []any) error {
			seen := make(map[types.NamespacedName]struct{}, len(list))
			var errs []error
			for _, obj := range list {
				t, nn, err := typed(obj)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				seen[nn] = struct{}{}
				if _, ok := s.known[nn]; ok {
					s.update(s.newStub(nn), t)
				} else {
					s.add(t)
				}
			}
			for nn := range s.known {
				if _, ok := seen[nn]; !ok {
					s.remove(s.newStub(nn))
				}
			}
			s.known = seen
			return errors.Join(errs...)
		},
	}
}
