package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/cri"
)

// fakeGCRuntime is an in-memory CRI for the garbage collectors' decisions: it lists
// what it holds and records what was stopped and removed.
type fakeGCRuntime struct {
	mu         sync.Mutex
	containers []*runtimeapi.Container
	sandboxes  []*runtimeapi.PodSandbox
	images     []*runtimeapi.Image
	mounts     map[string][]*runtimeapi.Mount // container ID -> its mounts, as ContainerStatus reports them
	stopped    []string
	removed    []string
	listErr    error
	removeErr  map[string]error
}

func (f *fakeGCRuntime) ListPodSandbox(context.Context, *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*runtimeapi.PodSandbox(nil), f.sandboxes...), f.listErr
}

func (f *fakeGCRuntime) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*runtimeapi.Container(nil), f.containers...), f.listErr
}

func (f *fakeGCRuntime) ContainerStatus(_ context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		if c.GetId() == id {
			return &runtimeapi.ContainerStatus{Id: id, State: c.GetState(), Mounts: f.mounts[id]}, nil
		}
	}
	return nil, fmt.Errorf("container %q: %w", id, cri.ErrNotFound)
}

func (f *fakeGCRuntime) ListImages(context.Context, *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*runtimeapi.Image(nil), f.images...), f.listErr
}

func (f *fakeGCRuntime) StopContainer(_ context.Context, id string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, id)
	return nil
}

func (f *fakeGCRuntime) RemoveContainer(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.removeErr[id]; err != nil {
		return err
	}
	f.removed = append(f.removed, id)
	for i, c := range f.containers {
		if c.GetId() == id {
			f.containers = append(f.containers[:i], f.containers[i+1:]...)
			break
		}
	}
	return nil
}

func (f *fakeGCRuntime) StopPodSandbox(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, id)
	return nil
}

func (f *fakeGCRuntime) RemovePodSandbox(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, id)
	for i, s := range f.sandboxes {
		if s.GetId() == id {
			f.sandboxes = append(f.sandboxes[:i], f.sandboxes[i+1:]...)
			break
		}
	}
	return nil
}

func (f *fakeGCRuntime) RemoveImage(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.removeErr[id]; err != nil {
		return err
	}
	f.removed = append(f.removed, id)
	for i, im := range f.images {
		if im.GetId() == id {
			f.images = append(f.images[:i], f.images[i+1:]...)
			break
		}
	}
	return nil
}

func (f *fakeGCRuntime) removedSorted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]string(nil), f.removed...)
	sort.Strings(out)
	return out
}

var gcEpoch = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// ctr is a container of pod uid named name, created minutesAgo before gcEpoch.
func ctr(id, uid, name string, state runtimeapi.ContainerState, minutesAgo int) *runtimeapi.Container {
	return &runtimeapi.Container{
		Id: id, PodSandboxId: "sb-" + uid, State: state,
		Metadata:  &runtimeapi.ContainerMetadata{Name: name},
		Labels:    map[string]string{cri.LabelPodUID: uid},
		CreatedAt: gcEpoch.Add(-time.Duration(minutesAgo) * time.Minute).UnixNano(),
		ImageRef:  "sha256:" + name,
	}
}

const (
	running = runtimeapi.ContainerState_CONTAINER_RUNNING
	exited  = runtimeapi.ContainerState_CONTAINER_EXITED
	unknown = runtimeapi.ContainerState_CONTAINER_UNKNOWN
)

func newTestContainerGC(rt gcRuntime, policy containerGCPolicy, known ...types.UID) *containerGC {
	set := map[types.UID]bool{}
	for _, u := range known {
		set[u] = true
	}
	return &containerGC{
		runtime: rt, policy: policy, clock: clocktesting.NewFakeClock(gcEpoch),
		removable:    func(uid types.UID) bool { return !set[uid] },
		sourcesReady: func() bool { return true },
	}
}

func TestContainerGCEvictsDeadContainers(t *testing.T) {
	tests := []struct {
		name         string
		policy       containerGCPolicy
		containers   []*runtimeapi.Container
		known        []types.UID
		sourcesReady bool
		wantRemoved  []string
		wantStopped  []string
	}{{
		name:   "defaults: the newest dead container of each container is kept, running ones are never touched",
		policy: defaultContainerGCPolicy(),
		containers: []*runtimeapi.Container{
			ctr("app-4", "p1", "app", running, 1), ctr("app-3", "p1", "app", exited, 3),
			ctr("app-2", "p1", "app", exited, 5), ctr("app-1", "p1", "app", exited, 7),
			ctr("side-1", "p1", "side", exited, 9),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
		wantRemoved: []string{"app-1", "app-2"},
	}, {
		name:   "crash loop in back-off: the newest (exited) one is kept for the status and --previous",
		policy: defaultContainerGCPolicy(),
		containers: []*runtimeapi.Container{
			ctr("c-3", "p1", "crash", exited, 1), ctr("c-2", "p1", "crash", exited, 2), ctr("c-1", "p1", "crash", exited, 3),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
		wantRemoved: []string{"c-1", "c-2"},
	}, {
		name:   "minimum age: younger dead containers are kept whatever the count",
		policy: containerGCPolicy{minAge: 4 * time.Minute, maxPerPodContainer: 1, maxContainers: -1},
		containers: []*runtimeapi.Container{
			ctr("c-4", "p1", "crash", exited, 1), ctr("c-3", "p1", "crash", exited, 3),
			ctr("c-2", "p1", "crash", exited, 5), ctr("c-1", "p1", "crash", exited, 7),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
		wantRemoved: []string{"c-1"},
	}, {
		name:   "maximum-dead-containers-per-container 3",
		policy: containerGCPolicy{maxPerPodContainer: 3, maxContainers: -1},
		containers: []*runtimeapi.Container{
			ctr("c-5", "p1", "crash", exited, 1), ctr("c-4", "p1", "crash", exited, 2), ctr("c-3", "p1", "crash", exited, 3),
			ctr("c-2", "p1", "crash", exited, 4), ctr("c-1", "p1", "crash", exited, 5),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
		wantRemoved: []string{"c-1", "c-2"},
	}, {
		name:   "negative per-container limit keeps every one",
		policy: containerGCPolicy{maxPerPodContainer: -1, maxContainers: -1},
		containers: []*runtimeapi.Container{
			ctr("c-2", "p1", "crash", exited, 1), ctr("c-1", "p1", "crash", exited, 2),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
	}, {
		name:   "maximum-dead-containers 2 over three units: one each, then the oldest overall",
		policy: containerGCPolicy{maxPerPodContainer: -1, maxContainers: 2},
		containers: []*runtimeapi.Container{
			ctr("a-2", "p1", "a", exited, 1), ctr("a-1", "p1", "a", exited, 10),
			ctr("b-1", "p1", "b", exited, 5), ctr("c-1", "p2", "c", exited, 7),
		},
		known: []types.UID{"p1", "p2"}, sourcesReady: true,
		wantRemoved: []string{"a-1", "c-1"},
	}, {
		name:   "pod gone: all its dead containers go, whatever the limits",
		policy: defaultContainerGCPolicy(),
		containers: []*runtimeapi.Container{
			ctr("g-2", "gone", "app", exited, 1), ctr("g-1", "gone", "app", exited, 2),
			ctr("k-1", "p1", "app", exited, 2),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
		wantRemoved: []string{"g-1", "g-2"},
	}, {
		name:   "pod unknown before the sources have loaded: only the per-container limit",
		policy: defaultContainerGCPolicy(),
		containers: []*runtimeapi.Container{
			ctr("g-2", "gone", "app", exited, 1), ctr("g-1", "gone", "app", exited, 2),
		},
		sourcesReady: false,
		wantRemoved:  []string{"g-1"},
	}, {
		name:   "unknown state: stopped before removal",
		policy: defaultContainerGCPolicy(),
		containers: []*runtimeapi.Container{
			ctr("u-2", "p1", "app", exited, 1), ctr("u-1", "p1", "app", unknown, 2),
		},
		known: []types.UID{"p1"}, sourcesReady: true,
		wantRemoved: []string{"u-1"}, wantStopped: []string{"u-1"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeGCRuntime{containers: tc.containers}
			g := newTestContainerGC(rt, tc.policy, tc.known...)
			ready := tc.sourcesReady
			g.sourcesReady = func() bool { return ready }
			g.podLogsDir = t.TempDir()
			require.NoError(t, g.garbageCollect(context.Background()))
			assert.Equal(t, tc.wantRemoved, nilIfEmpty(rt.removedSorted()))
			assert.Equal(t, tc.wantStopped, nilIfEmpty(rt.stopped))
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func TestContainerGCFailedRemovalIsLoggedAndCounted(t *testing.T) {
	// A removal that fails still counts as done for this round (the kubelet does not
	// remove a newer one instead), and the round reports no error.
	rt := &fakeGCRuntime{
		containers: []*runtimeapi.Container{
			ctr("c-3", "p1", "crash", exited, 1), ctr("c-2", "p1", "crash", exited, 2), ctr("c-1", "p1", "crash", exited, 3),
		},
		removeErr: map[string]error{"c-1": errors.New("device busy")},
	}
	g := newTestContainerGC(rt, defaultContainerGCPolicy(), "p1")
	g.podLogsDir = t.TempDir()
	require.NoError(t, g.garbageCollect(context.Background()))
	assert.Equal(t, []string{"c-2"}, rt.removedSorted())

	rt.listErr = errors.New("runtime down")
	err := g.garbageCollect(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "list containers: runtime down")
}

func TestContainerGCEvictsSandboxes(t *testing.T) {
	sb := func(id, uid string, ready bool, minutesAgo int) *runtimeapi.PodSandbox {
		st := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		if ready {
			st = runtimeapi.PodSandboxState_SANDBOX_READY
		}
		return &runtimeapi.PodSandbox{
			Id: id, State: st, Metadata: &runtimeapi.PodSandboxMetadata{Uid: uid},
			CreatedAt: gcEpoch.Add(-time.Duration(minutesAgo) * time.Minute).UnixNano(),
		}
	}
	rt := &fakeGCRuntime{
		sandboxes: []*runtimeapi.PodSandbox{
			// p1: a newer ready sandbox; the old dead one goes, the older one with a
			// container stays.
			sb("p1-new", "p1", true, 1), sb("p1-old", "p1", false, 5), sb("p1-older", "p1", false, 9),
			// p2: only a dead sandbox, pod still known: kept (the newest one).
			sb("p2-only", "p2", false, 3),
			// gone: every dead sandbox goes, a ready one stays for the pod worker.
			sb("gone-a", "gone", false, 3), sb("gone-b", "gone", false, 4), sb("gone-ready", "gone", true, 1),
		},
		containers: []*runtimeapi.Container{{Id: "x", PodSandboxId: "p1-older", State: running,
			Metadata: &runtimeapi.ContainerMetadata{Name: "x"}, Labels: map[string]string{cri.LabelPodUID: "p1"}}},
	}
	g := newTestContainerGC(rt, defaultContainerGCPolicy(), "p1", "p2")
	g.podLogsDir = t.TempDir()
	require.NoError(t, g.garbageCollect(context.Background()))
	assert.Equal(t, []string{"gone-a", "gone-b", "p1-old"}, rt.removedSorted())
}

func TestContainerGCEvictsPodLogDirs(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"default_web_uid-known", "default_old_uid-gone", "kube-system_a_b_c_uid-gone2"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d, "app"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, d, "app", "0.log"), []byte("x"), 0o644))
	}
	g := newTestContainerGC(&fakeGCRuntime{}, defaultContainerGCPolicy(), "uid-known")
	g.podLogsDir = dir
	ready := false
	g.sourcesReady = func() bool { return ready }
	require.NoError(t, g.garbageCollect(context.Background()))
	assert.DirExists(t, filepath.Join(dir, "default_old_uid-gone"), "nothing goes before the sources have loaded")

	ready = true
	require.NoError(t, g.garbageCollect(context.Background()))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "default_web_uid-known", entries[0].Name())

	// A missing folder is nothing to do.
	g.podLogsDir = filepath.Join(dir, "absent")
	assert.NoError(t, g.garbageCollect(context.Background()))
}

func img(id string, size uint64, pinned bool, tags ...string) *runtimeapi.Image {
	return &runtimeapi.Image{Id: id, Size: size, Pinned: pinned, RepoTags: tags}
}

func imageFsOf(capacity, available uint64) func(context.Context) (*statsapi.FsStats, error) {
	return func(context.Context) (*statsapi.FsStats, error) {
		return &statsapi.FsStats{CapacityBytes: &capacity, AvailableBytes: &available}, nil
	}
}

type gcEvent struct{ reason, message string }

func TestImageGC(t *testing.T) {
	policy := imageGCPolicy{highThresholdPercent: 85, lowThresholdPercent: 80, minAge: 2 * time.Minute}
	newGC := func(rt *fakeGCRuntime, fs func(context.Context) (*statsapi.FsStats, error), clk *clocktesting.FakeClock) (*imageGC, *[]gcEvent) {
		var events []gcEvent
		g := newImageGC(rt, policy, clk, fs, func(reason, msg string) { events = append(events, gcEvent{reason, msg}) })
		g.sandboxImage = "registry.k8s.io/pause:3.10.2"
		return g, &events
	}
	images := func() []*runtimeapi.Image {
		return []*runtimeapi.Image{
			img("sha256:used", 300, false, "nodekit.test/busybox:1.35.0"),
			img("sha256:pinned", 100, true, "other/pinned:1"),
			img("sha256:pause", 100, false, "registry.k8s.io/pause:3.10.2"),
			img("sha256:old", 200, false, "a/old:1"),
			img("sha256:older", 200, false, "a/older:1"),
		}
	}
	containers := []*runtimeapi.Container{
		// A dead container keeps its image in use, as the kubelet counts all containers.
		{Id: "c1", State: exited, ImageRef: "sha256:used", Image: &runtimeapi.ImageSpec{Image: "nodekit.test/busybox:1.35.0"}},
	}

	t.Run("under the high threshold: nothing removed", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		rt := &fakeGCRuntime{images: images(), containers: containers}
		g, events := newGC(rt, imageFsOf(1000, 200), clk) // 80% used
		began := clk.Now()
		require.NoError(t, g.garbageCollect(context.Background(), began))
		clk.Step(10 * time.Minute)
		require.NoError(t, g.garbageCollect(context.Background(), began))
		assert.Empty(t, rt.removedSorted())
		assert.Empty(t, *events)
	})

	t.Run("over the high threshold: unused, unpinned images old enough go, least recently used first", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		rt := &fakeGCRuntime{images: images(), containers: containers}
		g, events := newGC(rt, imageFsOf(1000, 100), clk) // 90% used: free 100 bytes to reach 80%
		began := clk.Now()
		// First round: everything just detected, younger than imageMinimumGCAge.
		err := g.garbageCollect(context.Background(), began)
		require.Error(t, err)
		assert.Empty(t, rt.removedSorted())
		require.Len(t, *events, 1)
		assert.Equal(t, eventFreeDiskSpaceFailed, (*events)[0].reason)
		assert.Equal(t, "Insufficient free disk space on the node's image filesystem (90% of 1000 B used). "+
			"Failed to free sufficient space by deleting unused images (freed 0 bytes). "+
			"Investigate disk usage, as it could be used by active images, logs, volumes, or other data.", (*events)[0].message)
		assert.Equal(t, (*events)[0].message, err.Error())

		// "old" was used a minute later than "older": "older" goes first, and is enough.
		clk.Step(time.Minute)
		rt.containers = append(rt.containers, &runtimeapi.Container{Id: "c2", State: exited, ImageRef: "sha256:old"})
		require.Error(t, g.garbageCollect(context.Background(), began))
		rt.containers = containers
		clk.Step(2 * time.Minute)
		require.NoError(t, g.garbageCollect(context.Background(), began))
		assert.Equal(t, []string{"sha256:older"}, rt.removedSorted())
	})

	t.Run("an image mounted as an image volume is in use", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		c2 := &runtimeapi.Container{Id: "c2", State: running, ImageRef: "sha256:used"}
		rt := &fakeGCRuntime{images: images(), containers: append(append([]*runtimeapi.Container(nil), containers...), c2),
			mounts: map[string][]*runtimeapi.Mount{"c2": {{ContainerPath: "/volume", Image: &runtimeapi.ImageSpec{Image: "sha256:old"}, Readonly: true}}}}
		g, _ := newGC(rt, imageFsOf(10000, 100), clk) // 99% used: every candidate would go
		began := clk.Now()
		_ = g.garbageCollect(context.Background(), began)
		clk.Step(3 * time.Minute)
		_ = g.garbageCollect(context.Background(), began)
		assert.Equal(t, []string{"sha256:older"}, rt.removedSorted(), "the image volume's image stays")
	})

	t.Run("not enough to free: every candidate goes and FreeDiskSpaceFailed says how much", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		rt := &fakeGCRuntime{images: images(), containers: containers}
		g, events := newGC(rt, imageFsOf(10000, 100), clk) // 99% used
		began := clk.Now()
		_ = g.garbageCollect(context.Background(), began)
		clk.Step(3 * time.Minute)
		*events = nil
		err := g.garbageCollect(context.Background(), began)
		require.Error(t, err)
		assert.Equal(t, []string{"sha256:old", "sha256:older"}, rt.removedSorted(), "the in-use, pinned and sandbox images stay")
		require.Len(t, *events, 1)
		assert.Contains(t, (*events)[0].message, "(99% of 9.8 KiB used)")
		assert.Contains(t, (*events)[0].message, "(freed 400 bytes)")
	})

	t.Run("maximum age: unused images go once the kubelet has run that long", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		rt := &fakeGCRuntime{images: images(), containers: containers}
		g, _ := newGC(rt, imageFsOf(1000, 900), clk)
		g.policy.maxAge = 10 * time.Minute
		began := clk.Now()
		require.NoError(t, g.garbageCollect(context.Background(), began))
		clk.Step(5 * time.Minute)
		require.NoError(t, g.garbageCollect(context.Background(), began))
		assert.Empty(t, rt.removedSorted())
		clk.Step(6 * time.Minute)
		require.NoError(t, g.garbageCollect(context.Background(), began))
		assert.Equal(t, []string{"sha256:old", "sha256:older"}, rt.removedSorted())
	})

	t.Run("capacity 0: InvalidDiskCapacity", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		g, events := newGC(&fakeGCRuntime{images: images()}, imageFsOf(0, 0), clk)
		err := g.garbageCollect(context.Background(), clk.Now())
		require.EqualError(t, err, "invalid capacity 0 on image filesystem")
		assert.Equal(t, []gcEvent{{eventInvalidDiskCapacity, "invalid capacity 0 on image filesystem"}}, *events)
	})

	t.Run("a failed removal is an error naming the bytes", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(gcEpoch)
		rt := &fakeGCRuntime{images: images(), containers: containers, removeErr: map[string]error{"sha256:old": errors.New("in use by a snapshot")}}
		g, _ := newGC(rt, imageFsOf(1000, 100), clk)
		began := clk.Now()
		_ = g.garbageCollect(context.Background(), began)
		clk.Step(3 * time.Minute)
		err := g.garbageCollect(context.Background(), began)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "wanted to free 100 bytes, but freed 200 bytes space with errors in image deletion: in use by a snapshot")
		assert.Equal(t, []string{"sha256:older"}, rt.removedSorted())
	})
}

func TestImageGCPolicyDisabled(t *testing.T) {
	assert.True(t, imageGCPolicy{highThresholdPercent: 100}.disabled())
	assert.False(t, imageGCPolicy{highThresholdPercent: 100, maxAge: time.Hour}.disabled())
	assert.False(t, imageGCPolicy{highThresholdPercent: 85}.disabled())
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{
		512: "512 B", 1536: "1.5 KiB", 10 << 20: "10.0 MiB", 100 << 30: "100.0 GiB", 3 << 40: "3.0 TiB",
	} {
		assert.Equal(t, want, formatSize(in))
	}
}
