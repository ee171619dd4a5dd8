package lease

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// The node lifecycle controller's defaults (kube-controller-manager flags).
const (
	// DefaultGracePeriod is --node-monitor-grace-period (50s since v1.32; 40s before).
	DefaultGracePeriod = 50 * time.Second
	// DefaultMonitorPeriod is --node-monitor-period.
	DefaultMonitorPeriod = 5 * time.Second
)

// WatcherConfig configures a Watcher. Client and OnTransition are required; the
// zero value of every other field means its documented default.
type WatcherConfig struct {
	// Client reaches the API server. Required.
	Client kubernetes.Interface
	// Namespace whose leases are watched. Empty means "kube-node-lease".
	Namespace string
	// GracePeriod is how long a lease may go without a new renewTime, measured by
	// Clock, before its holder counts as stale. Zero means DefaultGracePeriod (50s).
	GracePeriod time.Duration
	// MonitorPeriod is how often leases are judged. Zero means DefaultMonitorPeriod (5s).
	MonitorPeriod time.Duration
	// OnTransition is called, from Run's goroutine and one at a time, each time a
	// lease goes stale or comes back. Required.
	OnTransition func(Transition)
	// Clock times the grace period and the monitor ticks. Nil means the real clock.
	Clock clock.WithTicker
}

// Transition is one change a Watcher reports.
type Transition struct {
	// Namespace and Name identify the lease (the node name for node leases).
	Namespace, Name string
	// Holder is the lease's spec.holderIdentity when last seen.
	Holder string
	// Stale is true when the lease went stale and false when it came back.
	Stale bool
	// RenewTime is the lease's latest spec.renewTime (the holder's clock).
	RenewTime time.Time
	// LastChange is when the Watcher last saw renewTime advance (its own clock).
	LastChange time.Time
	// At is when the Watcher decided (its own clock).
	At time.Time
}

// String renders t in one line, for logs and examples.
func (t Transition) String() string {
	state := "came back"
	if t.Stale {
		state = "went stale"
	}
	return fmt.Sprintf("lease %s/%s (holder %q) %s", t.Namespace, t.Name, t.Holder, state)
}

// Watcher reports holders whose leases went stale and came back, judged as the
// node lifecycle controller judges node leases: a lease is stale once GracePeriod
// has passed on the Watcher's clock since the Watcher first saw it or last saw its
// renewTime advance. Comparing renewTime values only with each other keeps the
// holder's clock skew out of the verdict.
//
// The node lifecycle controller also counts a changed Ready heartbeat in the Node's
// status as a sign of life; the Watcher looks at leases only.
type Watcher struct {
	cfg     WatcherConfig
	running atomic.Bool

	mu     sync.Mutex
	leases map[string]*observed // by name
}

type observed struct {
	holder     string
	renewTime  time.Time
	lastChange time.Time
	stale      bool
}

// NewWatcher validates cfg and returns a Watcher; a bad WatcherConfig is an error
// wrapping ErrInvalidConfig.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = corev1.NamespaceNodeLease
	}
	if cfg.GracePeriod == 0 {
		cfg.GracePeriod = DefaultGracePeriod
	}
	if cfg.MonitorPeriod == 0 {
		cfg.MonitorPeriod = DefaultMonitorPeriod
	}
	var problems []error
	if cfg.Client == nil {
		problems = append(problems, errors.New("nil Client"))
	}
	if cfg.OnTransition == nil {
		problems = append(problems, errors.New("nil OnTransition"))
	}
	if cfg.GracePeriod < 0 {
		problems = append(problems, fmt.Errorf("GracePeriod %v is negative", cfg.GracePeriod))
	}
	if cfg.MonitorPeriod < 0 {
		problems = append(problems, fmt.Errorf("MonitorPeriod %v is negative", cfg.MonitorPeriod))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("lease watcher for namespace %s: %w: %w", cfg.Namespace, ErrInvalidConfig, errors.Join(problems...))
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Watcher{cfg: cfg, leases: map[string]*observed{}}, nil
}

// Run lists and watches the namespace's leases and judges them every MonitorPeriod
// until ctx ends; it then stops its informer, waits for it and returns nil. It
// returns ErrAlreadyRunning if the Watcher is already running.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("lease watcher for namespace %s: %w", w.cfg.Namespace, ErrAlreadyRunning)
	}
	defer w.running.Store(false)
	log := logr.FromContextOrDiscard(ctx).WithValues("namespace", w.cfg.Namespace)

	leases := w.cfg.Client.CoordinationV1().Leases(w.cfg.Namespace)
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		Logger: &log,
		// Passing the client lets a fake clientset, which cannot stream a list
		// through a watch, say so; the real API server does.
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				return leases.List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				return leases.Watch(ctx, opts)
			},
		}, w.cfg.Client),
		ObjectType: &coordinationv1.Lease{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.saw(obj) },
			UpdateFunc: func(_, obj any) { w.saw(obj) },
			DeleteFunc: func(obj any) { w.forget(obj) },
		},
	})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { informer.RunWithContext(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()

	ticker := w.cfg.Clock.NewTicker(w.cfg.MonitorPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
		for _, t := range w.judge() {
			log.V(4).Info("Lease transition", "lease", t.Name, "holder", t.Holder, "stale", t.Stale)
			w.cfg.OnTransition(t)
		}
	}
}

// saw records a lease from the informer. The time of a change is the Watcher's own.
func (w *Watcher) saw(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	var renew time.Time
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.Time
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	now := w.cfg.Clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	o, ok := w.leases[l.Name]
	if !ok {
		w.leases[l.Name] = &observed{holder: holder, renewTime: renew, lastChange: now}
		return
	}
	o.holder = holder
	if renew.After(o.renewTime) {
		o.renewTime = renew
		o.lastChange = now
	}
}

func (w *Watcher) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if l, ok := obj.(*coordinationv1.Lease); ok {
		w.mu.Lock()
		delete(w.leases, l.Name)
		w.mu.Unlock()
	}
}

// judge returns the transitions since the last call, sorted by lease name.
func (w *Watcher) judge() []Transition {
	now := w.cfg.Clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Transition
	for name, o := range w.leases {
		stale := now.After(o.lastChange.Add(w.cfg.GracePeriod))
		if stale == o.stale {
			continue
		}
		o.stale = stale
		out = append(out, Transition{
			Namespace: w.cfg.Namespace, Name: name, Holder: o.holder, Stale: stale,
			RenewTime: o.renewTime, LastChange: o.lastChange, At: now,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
