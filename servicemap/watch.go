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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
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
	// ResyncPeriod replays the informer caches to Handler; 0 (the default) never
	// does. kube-proxy uses its configSyncPeriod, 15 minutes by default.
	ResyncPeriod time.Duration
}

// Watcher lists and watches Services and EndpointSlices with kube-proxy's filters
// and feeds a Handler:
//
//   - Services: label selector "!service.kubernetes.io/service-proxy-name" and field
//     selector "spec.clusterIP!=None" (headless Services are left to DNS).
//   - EndpointSlices: label selector "!service.kubernetes.io/headless".
//
// managedFields are stripped from cached objects, as kube-proxy does.
type Watcher struct {
	handler Handler
	svcs    informers.SharedInformerFactory
	slices  informers.SharedInformerFactory
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

func trimManagedFields(obj any) (any, error) {
	if acc, err := meta.Accessor(obj); err == nil {
		acc.SetManagedFields(nil)
	}
	return obj, nil
}

// NewWatcher validates cfg and prepares the informers; Run starts them.
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
	w := &Watcher{handler: cfg.Handler, synced: make(chan struct{})}
	w.svcs = informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
		informers.WithTransform(trimManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = ServiceLabelSelector
			o.FieldSelector = ServiceFieldSelector
		}))
	w.slices = informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
		informers.WithTransform(trimManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = EndpointSliceLabelSelector
		}))
	return w, nil
}

// Synced is closed once the initial lists of Services and EndpointSlices have
// been delivered to the Handler.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Run watches until ctx ends, then stops the informers and waits for their
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

	svcReg, err := w.svcs.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*v1.Service); ok {
				w.handler.OnServiceAdd(s)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, _ := oldObj.(*v1.Service)
			if s, ok := newObj.(*v1.Service); ok {
				w.handler.OnServiceUpdate(o, s)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*v1.Service); ok {
				w.handler.OnServiceDelete(s)
			} else {
				log.Info("Ignoring deletion of an unexpected object", "type", fmt.Sprintf("%T", obj))
			}
		},
	})
	if err != nil {
		return fmt.Errorf("servicemap: register Service handler: %w", err)
	}
	esReg, err := w.slices.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if es, ok := obj.(*discovery.EndpointSlice); ok {
				w.handler.OnEndpointSliceAdd(es)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, _ := oldObj.(*discovery.EndpointSlice)
			if es, ok := newObj.(*discovery.EndpointSlice); ok {
				w.handler.OnEndpointSliceUpdate(o, es)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if es, ok := obj.(*discovery.EndpointSlice); ok {
				w.handler.OnEndpointSliceDelete(es)
			} else {
				log.Info("Ignoring deletion of an unexpected object", "type", fmt.Sprintf("%T", obj))
			}
		},
	})
	if err != nil {
		return fmt.Errorf("servicemap: register EndpointSlice handler: %w", err)
	}

	w.svcs.Start(ctx.Done())
	w.slices.Start(ctx.Done())
	defer func() {
		w.svcs.Shutdown()
		w.slices.Shutdown()
	}()
	log.V(4).Info("Waiting for Service and EndpointSlice caches")
	if cache.WaitForCacheSync(ctx.Done(), svcReg.HasSynced, esReg.HasSynced) {
		log.Info("Services and EndpointSlices synced")
		close(w.synced)
	}
	<-ctx.Done()
	return nil
}
