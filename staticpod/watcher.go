package staticpod

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// EventType says what changed.
type EventType int

const (
	// EventSync is the first event of a Run: the complete set after the first read of
	// the folder (possibly empty: a missing folder is an empty set). It tells the
	// caller the source has been seen, like the kubelet's first file-source update.
	EventSync EventType = iota
	// EventAdd: a file now provides a pod. Pod is the new pod.
	EventAdd
	// EventUpdate: the file's pod changed. Old is the previous pod, Pod the new one.
	// Unless the manifest pins metadata.uid, the UID changes with the content, and the
	// kubelet treats that as "remove the old pod, add the new one".
	EventUpdate
	// EventRemove: the file no longer provides a pod (deleted, renamed away, now
	// ignored, shadowed by a duplicate, or broken under DropBroken). Pod is the pod removed.
	EventRemove
	// EventError: the file does not load. Err says why (a *ManifestError) and
	// KeptLastGood whether the file's previous pod stays in the set. Each distinct
	// problem is reported once, not on every rescan.
	EventError
)

func (t EventType) String() string {
	switch t {
	case EventSync:
		return "Sync"
	case EventAdd:
		return "Add"
	case EventUpdate:
		return "Update"
	case EventRemove:
		return "Remove"
	case EventError:
		return "Error"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change to the set of static pods. Pods and the pods the event points
// to are shared with the watcher: treat them as read-only (DeepCopy to modify).
type Event struct {
	Type EventType
	// Path is the manifest file (empty for EventSync).
	Path string
	Pod  *corev1.Pod
	Old  *corev1.Pod
	Err  error
	// KeptLastGood (EventError): the file's last good pod is still in the set.
	KeptLastGood bool
	// Pods is the whole set after the change this event belongs to, sorted by file.
	Pods []*corev1.Pod
}

// DefaultSettleDelay is how long a file that fails to load right after an inotify
// event may take to become valid before it counts as broken.
const DefaultSettleDelay = 100 * time.Millisecond

// watchRetryPeriod is how often a missing or unwatchable folder is retried (the
// kubelet retries its inotify watch every second too).
const watchRetryPeriod = time.Second

// Watcher keeps the set of static pods of a folder current. Build it with New, start
// it with Run, and read Events until the channel closes.
type Watcher struct {
	cfg     Config
	events  chan Event
	started atomic.Bool

	mu      sync.Mutex
	current []*corev1.Pod
}

// New validates cfg and returns a Watcher that has not started yet.
func New(cfg Config) (*Watcher, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Watcher{cfg: c, events: make(chan Event, 64)}, nil
}

// Events returns the event channel. It is closed when Run returns. Run blocks while
// the channel is full, so the caller must keep reading.
func (w *Watcher) Events() <-chan Event { return w.events }

// Pods returns the current set, sorted by file (nil before the first read).
func (w *Watcher) Pods() []*corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*corev1.Pod(nil), w.current...)
}

// Run watches the folder until ctx ends, then closes the Events channel and returns
// nil. It returns an error only if inotify cannot be set up at all, or when called
// twice. Sources of change: inotify events on the folder (handled at once), a full
// rescan every RescanPeriod (which catches anything inotify missed: edits behind
// symlinks, queue overflows), and a retry every second while the folder is missing.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	defer close(w.events)
	log := logr.FromContextOrDiscard(ctx).WithValues("dir", w.cfg.Dir)
	ctx = logr.NewContext(ctx, log)

	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("staticpod: start inotify for %s: %w", w.cfg.Dir, err)
	}
	defer fsw.Close()

	r := &run{w: w, s: newScanner(w.cfg), prev: map[string]*corev1.Pod{}, pending: map[string]bool{}, fsw: fsw, log: log}
	defer r.stopSettle()
	r.watch()
	r.fullScan(ctx)
	if err := r.commit(ctx, true); err != nil {
		return nil
	}

	rescan := w.cfg.Clock.NewTicker(w.cfg.RescanPeriod)
	defer rescan.Stop()
	retry := w.cfg.Clock.NewTicker(watchRetryPeriod)
	defer retry.Stop()

	for {
		var settleC <-chan time.Time
		if r.settle != nil {
			settleC = r.settle.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fsw.Events:
			if !ok {
				return nil
			}
			r.handle(ctx, ev)
		case err, ok := <-fsw.Errors:
			if !ok {
				return nil
			}
			log.Error(err, "inotify error; rescanning the folder")
			r.fullScan(ctx)
		case <-rescan.C():
			if !r.watching {
				r.watch()
			}
			r.fullScan(ctx)
		case <-retry.C():
			if r.watching {
				continue
			}
			if r.watch() {
				r.fullScan(ctx)
			}
		case <-settleC:
			r.settle = nil
			for p := range r.pending {
				r.s.scanOne(ctx, p)
				if st := r.s.files[p]; st != nil {
					st.held = false
				}
			}
			clear(r.pending)
		}
		if err := r.commit(ctx, false); err != nil {
			return nil
		}
	}
}

// run is the state of one Run; only Run's goroutine touches it.
type run struct {
	w        *Watcher
	s        *scanner
	prev     map[string]*corev1.Pod
	fsw      *fsnotify.Watcher
	log      logr.Logger
	watching bool
	pending  map[string]bool
	settle   clock.Timer
}

func (r *run) stopSettle() {
	if r.settle != nil {
		r.settle.Stop()
	}
}

// watch adds the inotify watch on the folder and reports whether it is in place.
func (r *run) watch() bool {
	if err := r.fsw.Add(r.w.cfg.Dir); err != nil {
		if r.watching || !errors.Is(err, errNotExist) {
			r.log.V(4).Info("Cannot watch the manifest folder yet; retrying", "err", err.Error())
		}
		r.watching = false
		return false
	}
	if !r.watching {
		r.log.V(4).Info("Watching the manifest folder")
	}
	r.watching = true
	return true
}

func (r *run) fullScan(ctx context.Context) {
	if err := r.s.scanAll(ctx); err != nil && ctx.Err() == nil {
		r.log.Error(err, "Cannot read the manifest folder; keeping the current set")
	}
}

func (r *run) handle(ctx context.Context, ev fsnotify.Event) {
	dir := r.w.cfg.Dir
	if filepath.Clean(ev.Name) == dir {
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			// The folder itself went away: drop the watch, let the retry re-add it.
			_ = r.fsw.Remove(dir)
			r.watching = false
			r.fullScan(ctx)
		}
		return
	}
	if filepath.Dir(ev.Name) != dir {
		return
	}
	name := filepath.Base(ev.Name)
	if r.w.cfg.Ignore(name) {
		// A projected ConfigMap or Secret swaps its "..data" link to publish new
		// content; the visible files are symlinks through it, so re-read them all.
		if strings.HasPrefix(name, "..") {
			r.fullScan(ctx)
		}
		return
	}
	r.log.V(4).Info("Manifest changed", "path", ev.Name, "op", ev.Op.String())
	r.s.scanOne(ctx, ev.Name)
	if st := r.s.files[ev.Name]; st != nil && st.err != nil && !st.reported && r.w.cfg.SettleDelay > 0 {
		// Writers often produce a file in several steps (truncate, then write).
		// Give it a moment before calling it broken.
		st.held = true
		r.pending[ev.Name] = true
		if r.settle == nil {
			r.settle = r.w.cfg.Clock.NewTimer(r.w.cfg.SettleDelay)
		}
	}
}

// commit turns the scanner's state into events.
func (r *run) commit(ctx context.Context, initial bool) error {
	eff := r.s.effective()
	cur := make(map[string]*corev1.Pod, len(eff))
	pods := make([]*corev1.Pod, 0, len(eff))
	var adds, updates, removes, errs []Event
	for _, e := range eff {
		cur[e.path] = e.pod
		pods = append(pods, e.pod)
		if old, ok := r.prev[e.path]; !ok {
			adds = append(adds, Event{Type: EventAdd, Path: e.path, Pod: e.pod})
		} else if old != e.pod {
			updates = append(updates, Event{Type: EventUpdate, Path: e.path, Pod: e.pod, Old: old})
		}
	}
	for p, old := range r.prev {
		if _, ok := cur[p]; !ok {
			removes = append(removes, Event{Type: EventRemove, Path: p, Pod: old})
		}
	}
	sort.Slice(removes, func(i, j int) bool { return removes[i].Path < removes[j].Path })
	for _, p := range r.s.sortedPaths() {
		st := r.s.files[p]
		if st.err == nil || st.reported || st.held {
			continue
		}
		st.reported = true
		_, kept := cur[p]
		errs = append(errs, Event{Type: EventError, Path: p, Err: st.err, KeptLastGood: kept})
		r.w.cfg.Metrics.IncManifestError(errorReason(st.err))
		r.log.Error(st.err, "Static pod manifest does not load", "path", p, "keptLastGood", kept)
	}
	r.prev = cur

	r.w.mu.Lock()
	r.w.current = pods
	r.w.mu.Unlock()

	var out []Event
	if initial {
		out = append(out, Event{Type: EventSync})
	} else {
		out = append(append(append(out, removes...), adds...), updates...)
	}
	out = append(out, errs...)
	for _, ev := range out {
		ev.Pods = pods
		switch ev.Type {
		case EventAdd, EventUpdate, EventRemove:
			r.log.V(0).Info("Static pod "+strings.ToLower(ev.Type.String()), "path", ev.Path, "pod", ev.Pod.Namespace+"/"+ev.Pod.Name, "uid", ev.Pod.UID)
		}
		r.w.cfg.Metrics.ObserveEvent(ev.Type)
		select {
		case r.w.events <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func errorReason(err error) string {
	for _, k := range []error{ErrSyntax, ErrWrongKind, ErrMultipleDocuments, ErrUnknownField, ErrFieldType,
		ErrInvalidPod, ErrAPIReference, ErrTooLarge, ErrUnreadable, ErrDuplicateName} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return ErrInvalidManifest.Error()
}
