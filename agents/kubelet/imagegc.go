package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/cri"
)

// Image garbage collection, as the kubelet's realImageGCManager (pkg/kubelet/images
// image_gc_manager.go, v1.37.2) run every five minutes by StartGarbageCollection.
//
// Each round lists the runtime's images and containers. An image is in use while any
// container (running or dead) was created from it; its last-used time is then now. An
// image seen for the first time is recorded with that time as first detected. Images
// neither in use nor pinned (CRI Image.pinned, as containerd pins its sandbox image)
// are candidates, least recently used first (then first detected first).
//
//   - With imageMaximumGCAge > 0 and the kubelet running longer than it, candidates
//     unused for longer go (reason "age").
//   - When the image file system (CRI ImageFsInfo's mount point, capacity and
//     available bytes by statfs) is used at imageGCHighThresholdPercent or more,
//     candidates go until the bytes freed bring it to imageGCLowThresholdPercent
//     (reason "space"), skipping any used in this round and any first detected less
//     than imageMinimumGCAge ago. Freeing too little is a FreeDiskSpaceFailed event
//     with the kubelet's message.
//
// A high threshold of 100 with no maximum age turns image GC off, as upstream.

// imageGCPeriod is the kubelet's ImageGCPeriod.
const imageGCPeriod = 5 * time.Minute

// Reasons of kubelet_image_garbage_collected_total, and the kubelet's event reasons.
const (
	imageGCReasonAge   = "age"
	imageGCReasonSpace = "space"

	eventImageGCFailed       = "ImageGCFailed"
	eventContainerGCFailed   = "ContainerGCFailed"
	eventFreeDiskSpaceFailed = "FreeDiskSpaceFailed"
	eventInvalidDiskCapacity = "InvalidDiskCapacity"
)

// imageGCPolicy is the kubelet's ImageGCPolicy from the KubeletConfiguration fields
// imageGCHighThresholdPercent (default 85), imageGCLowThresholdPercent (80),
// imageMinimumGCAge (2m) and imageMaximumGCAge (0: off).
type imageGCPolicy struct {
	highThresholdPercent, lowThresholdPercent int
	minAge, maxAge                            time.Duration
}

// disabled: upstream starts no image GC loop for this policy.
func (p imageGCPolicy) disabled() bool { return p.highThresholdPercent == 100 && p.maxAge == 0 }

// imageRuntime is the part of the CRI the image garbage collector calls.
type imageRuntime interface {
	ListImages(ctx context.Context, filter *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error)
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error)
	RemoveImage(ctx context.Context, image string) error
}

type imageGC struct {
	runtime imageRuntime
	policy  imageGCPolicy
	clock   clock.Clock
	// imageFs reads the image file system's capacity and available bytes.
	imageFs func(ctx context.Context) (*statsapi.FsStats, error)
	// event records a Warning event about the node; nil records nothing.
	event func(reason, message string)
	// sandboxImage is the runtime's sandbox (pause) image reference, treated as
	// pinned: containerd before 1.7 does not report CRI Image.pinned, and removing
	// its sandbox image would leave the node unable to start pods without a
	// registry. "" when unknown.
	sandboxImage string

	mu      sync.Mutex
	records map[string]*imageRecord
}

type imageRecord struct {
	firstDetected, lastUsed time.Time
	size                    uint64
	pinned                  bool
}

type evictionCandidate struct {
	id string
	imageRecord
}

func newImageGC(runtime imageRuntime, policy imageGCPolicy, clk clock.Clock, imageFs func(context.Context) (*statsapi.FsStats, error), event func(reason, message string)) *imageGC {
	return &imageGC{runtime: runtime, policy: policy, clock: clk, imageFs: imageFs, event: event, records: map[string]*imageRecord{}}
}

// detectImages updates the records from the runtime and returns the images in use,
// by image ID.
func (g *imageGC) detectImages(ctx context.Context, detected time.Time) (map[string]bool, error) {
	images, err := g.runtime.ListImages(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	containers, err := g.runtime.ListContainers(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	// A container names its image by ID (image_ref) and, depending on the runtime,
	// by the reference it was created from: match either against each image.
	refs := map[string]bool{}
	for _, c := range containers {
		if r := c.GetImageRef(); r != "" {
			refs[r] = true
		}
		if r := c.GetImage().GetImage(); r != "" {
			refs[r] = true
		}
		// An image volume's image is in use too: the runtime reports it among the
		// container's mounts (upstream's handleImageVolumes). A container removed
		// since the listing holds nothing.
		status, err := g.runtime.ContainerStatus(ctx, c.GetId())
		if errors.Is(err, cri.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("container %s status: %w", c.GetId(), err)
		}
		for _, m := range status.GetMounts() {
			if r := m.GetImage().GetImage(); r != "" {
				refs[r] = true
			}
		}
	}
	now := g.clock.Now()
	inUse := map[string]bool{}
	current := map[string]bool{}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, img := range images {
		id := img.GetId()
		current[id] = true
		r, ok := g.records[id]
		if !ok {
			r = &imageRecord{firstDetected: detected}
			g.records[id] = r
		}
		if imageReferenced(img, refs) {
			inUse[id] = true
			r.lastUsed = now
		}
		r.size = img.GetSize()
		r.pinned = img.GetPinned() || (g.sandboxImage != "" && imageReferenced(img, map[string]bool{g.sandboxImage: true}))
	}
	for id := range g.records {
		if !current[id] {
			delete(g.records, id)
		}
	}
	return inUse, nil
}

func imageReferenced(img *runtimeapi.Image, refs map[string]bool) bool {
	if refs[img.GetId()] {
		return true
	}
	for _, names := range [][]string{img.GetRepoTags(), img.GetRepoDigests()} {
		for _, n := range names {
			if refs[n] {
				return true
			}
		}
	}
	return false
}

// candidates are the images neither in use nor pinned, least recently used first.
func (g *imageGC) candidates(ctx context.Context, now time.Time) ([]evictionCandidate, error) {
	inUse, err := g.detectImages(ctx, now)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]evictionCandidate, 0, len(g.records))
	for id, r := range g.records {
		if inUse[id] || r.pinned {
			continue
		}
		out = append(out, evictionCandidate{id: id, imageRecord: *r})
	}
	// The kubelet's order; the ID breaks the remaining ties so rounds are repeatable.
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.lastUsed.Equal(b.lastUsed) {
			return a.lastUsed.Before(b.lastUsed)
		}
		if !a.firstDetected.Equal(b.firstDetected) {
			return a.firstDetected.Before(b.firstDetected)
		}
		return a.id < b.id
	})
	return out, nil
}

// garbageCollect runs one round; began is when the kubelet started image GC (the
// maximum age counts only once the kubelet has run that long).
func (g *imageGC) garbageCollect(ctx context.Context, began time.Time) error {
	now := g.clock.Now()
	images, err := g.candidates(ctx, now)
	if err != nil {
		return err
	}
	if images, err = g.freeOldImages(ctx, images, now, began); err != nil {
		return err
	}
	fs, err := g.imageFs(ctx)
	if err != nil {
		return err
	}
	var capacity, available int64
	if fs.CapacityBytes != nil {
		capacity = int64(*fs.CapacityBytes)
	}
	if fs.AvailableBytes != nil {
		available = int64(*fs.AvailableBytes)
	}
	if available > capacity {
		klog.InfoS("Availability is larger than capacity", "available", available, "capacity", capacity)
		available = capacity
	}
	if capacity == 0 {
		err := errors.New("invalid capacity 0 on image filesystem")
		g.warn(eventInvalidDiskCapacity, err.Error())
		return err
	}
	usage := 100 - int(available*100/capacity)
	if usage < g.policy.highThresholdPercent {
		return nil
	}
	toFree := capacity*int64(100-g.policy.lowThresholdPercent)/100 - available
	klog.InfoS("Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold",
		"usage", usage, "highThreshold", g.policy.highThresholdPercent, "amountToFree", toFree, "lowThreshold", g.policy.lowThresholdPercent)
	freed, err := g.freeSpace(ctx, toFree, now, images)
	if err != nil {
		return err
	}
	if freed < toFree {
		msg := fmt.Sprintf("Insufficient free disk space on the node's image filesystem (%d%% of %s used). "+
			"Failed to free sufficient space by deleting unused images (freed %d bytes). "+
			"Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
			usage, formatSize(capacity), freed)
		g.warn(eventFreeDiskSpaceFailed, msg)
		return errors.New(msg)
	}
	return nil
}

func (g *imageGC) warn(reason, msg string) {
	if g.event != nil {
		g.event(reason, msg)
	}
}

func (g *imageGC) freeOldImages(ctx context.Context, images []evictionCandidate, now, began time.Time) ([]evictionCandidate, error) {
	if g.policy.maxAge == 0 || now.Sub(began) <= g.policy.maxAge {
		return images, nil
	}
	var errs []error
	left := images[:0:0]
	for _, img := range images {
		if now.Sub(img.lastUsed) <= g.policy.maxAge {
			left = append(left, img)
			continue
		}
		if err := g.freeImage(ctx, img, imageGCReasonAge); err != nil {
			errs = append(errs, err)
			left = append(left, img)
		}
	}
	if len(errs) > 0 {
		return left, fmt.Errorf("wanted to free images older than %v, encountered errors in image deletion: %w", g.policy.maxAge, errors.Join(errs...))
	}
	return left, nil
}

func (g *imageGC) freeSpace(ctx context.Context, toFree int64, now time.Time, images []evictionCandidate) (int64, error) {
	var errs []error
	var freed int64
	for _, img := range images {
		if !img.lastUsed.Before(now) {
			klog.V(5).InfoS("Image ID was used too recently, not eligible for garbage collection", "imageID", img.id, "lastUsed", img.lastUsed, "freeTime", now)
			continue
		}
		if age := now.Sub(img.firstDetected); age < g.policy.minAge {
			klog.V(5).InfoS("Image ID's age is less than the policy's minAge, not eligible for garbage collection", "imageID", img.id, "age", age, "minAge", g.policy.minAge)
			continue
		}
		if err := g.freeImage(ctx, img, imageGCReasonSpace); err != nil {
			errs = append(errs, err)
			continue
		}
		freed += int64(img.size)
		if freed >= toFree {
			break
		}
	}
	if len(errs) > 0 {
		return freed, fmt.Errorf("wanted to free %d bytes, but freed %d bytes space with errors in image deletion: %w", toFree, freed, errors.Join(errs...))
	}
	return freed, nil
}

func (g *imageGC) freeImage(ctx context.Context, img evictionCandidate, reason string) error {
	klog.InfoS("Removing image to free bytes", "imageID", img.id, "size", img.size)
	if err := g.runtime.RemoveImage(ctx, img.id); err != nil {
		return err
	}
	g.mu.Lock()
	delete(g.records, img.id)
	g.mu.Unlock()
	imageGarbageCollected.WithLabelValues(reason).Inc()
	return nil
}

// formatSize writes a byte count as the kubelet's message does ("9.8 GiB").
func formatSize(n int64) string {
	const (
		kib = 1 << 10
		mib = 1 << 20
		gib = 1 << 30
		tib = 1 << 40
	)
	f := float64(n)
	switch {
	case n < kib:
		return fmt.Sprintf("%d B", n)
	case n < mib:
		return fmt.Sprintf("%.1f KiB", f/kib)
	case n < gib:
		return fmt.Sprintf("%.1f MiB", f/mib)
	case n < tib:
		return fmt.Sprintf("%.1f GiB", f/gib)
	}
	return fmt.Sprintf("%.1f TiB", f/tib)
}

// runGarbageCollection is the kubelet's StartGarbageCollection: container GC every
// minute, image GC every five minutes (unless the policy turns it off), with the
// kubelet's logs and events (ContainerGCFailed on each failure, ImageGCFailed from
// the second image GC failure in a row). It returns when ctx ends.
func runGarbageCollection(ctx context.Context, clk clock.WithTicker, periods gcIntervals, cgc *containerGC, igc *imageGC, nodeEvent func(reason, message string)) {
	if nodeEvent == nil {
		nodeEvent = func(string, string) {}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	every := func(period time.Duration, fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := clk.NewTicker(period)
			defer t.Stop()
			for {
				fn()
				select {
				case <-ctx.Done():
					return
				case <-t.C():
				}
			}
		}()
	}
	containerFailed := false
	every(periods.containers, func() {
		if err := cgc.garbageCollect(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			klog.ErrorS(err, "Container garbage collection failed")
			nodeEvent(eventContainerGCFailed, err.Error())
			containerFailed = true
			return
		}
		if containerFailed {
			klog.V(1).InfoS("Container garbage collection succeeded")
			containerFailed = false
			return
		}
		klog.V(4).InfoS("Container garbage collection succeeded")
	})
	if igc == nil || igc.policy.disabled() {
		klog.V(2).InfoS("ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC")
		return
	}
	began := clk.Now()
	imageFailed := false
	every(periods.images, func() {
		if err := igc.garbageCollect(ctx, began); err != nil {
			if ctx.Err() != nil {
				return
			}
			if imageFailed {
				klog.ErrorS(err, "Image garbage collection failed multiple times in a row")
				nodeEvent(eventImageGCFailed, err.Error())
			} else {
				klog.ErrorS(err, "Image garbage collection failed once. Stats initialization may not have completed yet")
			}
			imageFailed = true
			return
		}
		if imageFailed {
			klog.V(1).InfoS("Image garbage collection succeeded")
			imageFailed = false
			return
		}
		klog.V(4).InfoS("Image garbage collection succeeded")
	})
}

// nodeWarning returns a function recording a Warning event about the node, or nil
// without a recorder.
func nodeWarning(rec record.EventRecorder, ref *corev1.ObjectReference) func(reason, message string) {
	if rec == nil {
		return nil
	}
	return func(reason, message string) { rec.Event(ref, corev1.EventTypeWarning, reason, message) }
}
