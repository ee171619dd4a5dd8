package staticpod_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/staticpod"
	"github.com/nodekit-dev/nodekit/staticpod/staticpodtest"
)

// wait is generous: inotify delivers in microseconds, but CI machines are busy.
const wait = 5 * time.Second

// startWatcher runs a Watcher until the test ends. Unless the test sets one, the
// rescan period is an hour so that every change the test sees came through inotify.
func startWatcher(t *testing.T, cfg staticpod.Config) (*staticpod.Watcher, *staticpodtest.Collector) {
	t.Helper()
	if cfg.NodeName == "" {
		cfg.NodeName = "node-a"
	}
	if cfg.RescanPeriod == 0 {
		cfg.RescanPeriod = time.Hour
	}
	w, err := staticpod.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	c := staticpodtest.Collect(w.Events())
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(wait):
			t.Error("Run did not return after cancel")
		}
	})
	return w, c
}

func podYAML(name, image string) []byte {
	return []byte(strings.NewReplacer("web", name, "nginx:1.27", image).Replace(minimal))
}

func TestWatcherLifecycle(t *testing.T) {
	dir := t.TempDir()
	staticpodtest.WriteManifest(t, dir, "a.yaml", podYAML("a", "nginx:1"))
	w, c := startWatcher(t, staticpod.Config{Dir: dir})

	sync := c.Next(t, wait, "Sync", staticpodtest.Is(staticpod.EventSync, ""))
	assert.Equal(t, []string{"default/a-node-a"}, staticpodtest.Names(sync.Pods), "Sync carries the initial set")

	t.Run("create", func(t *testing.T) {
		staticpodtest.WriteManifest(t, dir, "b.yaml", podYAML("b", "nginx:1"))
		ev := c.Next(t, wait, "Add b", staticpodtest.Is(staticpod.EventAdd, "b.yaml"))
		assert.Equal(t, "b-node-a", ev.Pod.Name)
		assert.Equal(t, []string{"default/a-node-a", "default/b-node-a"}, staticpodtest.Names(ev.Pods))
		assert.NotEmpty(t, ev.Pod.Annotations[staticpod.AnnotationConfigSeen])
	})

	t.Run("edit in place", func(t *testing.T) {
		// os.WriteFile truncates then writes: the watcher may briefly see an empty
		// file, which must not surface as an error or a removal.
		require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), podYAML("a", "nginx:2"), 0o644))
		ev := c.Next(t, wait, "Update a", staticpodtest.Is(staticpod.EventUpdate, "a.yaml"))
		assert.Equal(t, "nginx:2", ev.Pod.Spec.Containers[0].Image)
		assert.Equal(t, "nginx:1", ev.Old.Spec.Containers[0].Image)
		assert.NotEqual(t, ev.Old.UID, ev.Pod.UID, "the UID follows the content")
	})

	t.Run("editor-style save", func(t *testing.T) {
		// vim with backupcopy=no: write a swap/backup file, rename the original away,
		// write the new file under the real name, remove the backup.
		a := filepath.Join(dir, "a.yaml")
		require.NoError(t, os.WriteFile(filepath.Join(dir, ".a.yaml.swp"), []byte("\x00binary swap"), 0o600))
		require.NoError(t, os.Rename(a, a+"~"))
		require.NoError(t, os.WriteFile(a, podYAML("a", "nginx:3"), 0o644))
		require.NoError(t, os.Remove(a+"~"))
		require.NoError(t, os.Remove(filepath.Join(dir, ".a.yaml.swp")))
		ev := c.Next(t, wait, "a at nginx:3", func(ev staticpod.Event) bool {
			return (ev.Type == staticpod.EventUpdate || ev.Type == staticpod.EventAdd) && ev.Pod.Spec.Containers[0].Image == "nginx:3"
		})
		assert.Equal(t, []string{"default/a-node-a", "default/b-node-a"}, staticpodtest.Names(ev.Pods))
	})

	t.Run("atomic rename", func(t *testing.T) {
		staticpodtest.WriteManifest(t, dir, "b.yaml", podYAML("b", "nginx:2"))
		ev := c.Next(t, wait, "Update b", staticpodtest.Is(staticpod.EventUpdate, "b.yaml"))
		assert.Equal(t, "nginx:2", ev.Pod.Spec.Containers[0].Image)
	})

	t.Run("delete", func(t *testing.T) {
		require.NoError(t, os.Remove(filepath.Join(dir, "b.yaml")))
		ev := c.Next(t, wait, "Remove b", staticpodtest.Is(staticpod.EventRemove, "b.yaml"))
		assert.Equal(t, "b-node-a", ev.Pod.Name)
		assert.Equal(t, []string{"default/a-node-a"}, staticpodtest.Names(ev.Pods))
	})

	t.Run("rename away", func(t *testing.T) {
		staticpodtest.WriteManifest(t, dir, "c.yaml", podYAML("c", "nginx:1"))
		c.Next(t, wait, "Add c", staticpodtest.Is(staticpod.EventAdd, "c.yaml"))
		require.NoError(t, os.Rename(filepath.Join(dir, "c.yaml"), filepath.Join(dir, ".c.yaml.disabled")))
		c.Next(t, wait, "Remove c", staticpodtest.Is(staticpod.EventRemove, "c.yaml"))
	})

	for _, ev := range c.Events() {
		assert.NotEqual(t, staticpod.EventError, ev.Type, "no error events in a clean lifecycle: %v", ev.Err)
	}
	assert.Equal(t, []string{"default/a-node-a"}, staticpodtest.Names(w.Pods()))
}

func TestWatcherBreakAndFix(t *testing.T) {
	for _, policy := range []staticpod.BrokenPolicy{staticpod.KeepLastGood, staticpod.DropBroken} {
		name := map[staticpod.BrokenPolicy]string{staticpod.KeepLastGood: "KeepLastGood", staticpod.DropBroken: "DropBroken"}[policy]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			staticpodtest.WriteManifest(t, dir, "a.yaml", podYAML("a", "nginx:1"))
			staticpodtest.WriteManifest(t, dir, "b.yaml", podYAML("b", "nginx:1"))
			w, c := startWatcher(t, staticpod.Config{Dir: dir, OnBroken: policy})
			c.Next(t, wait, "Sync", staticpodtest.Is(staticpod.EventSync, ""))

			broken := strings.Replace(string(podYAML("a", "nginx:2")), "image:", "imagee:", 1)
			staticpodtest.WriteManifest(t, dir, "a.yaml", []byte(broken))
			ev := c.Next(t, wait, "Error a", staticpodtest.Is(staticpod.EventError, "a.yaml"))
			require.ErrorIs(t, ev.Err, staticpod.ErrUnknownField)
			assert.Contains(t, ev.Err.Error(), "a.yaml:8:5: spec.containers[0].imagee")

			if policy == staticpod.KeepLastGood {
				assert.True(t, ev.KeptLastGood)
				assert.Equal(t, []string{"default/a-node-a", "default/b-node-a"}, staticpodtest.Names(ev.Pods), "the last good a keeps running")
				assert.Equal(t, "nginx:1", ev.Pods[0].Spec.Containers[0].Image)
			} else {
				assert.False(t, ev.KeptLastGood)
				assert.Equal(t, []string{"default/b-node-a"}, staticpodtest.Names(ev.Pods), "the kubelet's behaviour: a is dropped")
			}

			// The broken file does not block others.
			staticpodtest.WriteManifest(t, dir, "c.yaml", podYAML("c", "nginx:1"))
			c.Next(t, wait, "Add c", staticpodtest.Is(staticpod.EventAdd, "c.yaml"))

			// Fix it.
			staticpodtest.WriteManifest(t, dir, "a.yaml", podYAML("a", "nginx:3"))
			want := staticpod.EventUpdate
			if policy == staticpod.DropBroken {
				want = staticpod.EventAdd
			}
			ev = c.Next(t, wait, "a fixed", staticpodtest.Is(want, "a.yaml"))
			assert.Equal(t, "nginx:3", ev.Pod.Spec.Containers[0].Image)
			assert.Equal(t, []string{"default/a-node-a", "default/b-node-a", "default/c-node-a"}, staticpodtest.Names(w.Pods()))

			var removes, errs int
			for _, ev := range c.Events() {
				switch ev.Type {
				case staticpod.EventRemove:
					removes++
				case staticpod.EventError:
					errs++
				}
			}
			assert.Equal(t, 1, errs, "the error is reported once")
			if policy == staticpod.KeepLastGood {
				assert.Zero(t, removes, "nothing is ever removed under KeepLastGood")
			} else {
				assert.Equal(t, 1, removes)
			}
		})
	}
}

func TestWatcherFolderCreatedLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "manifests")
	_, c := startWatcher(t, staticpod.Config{Dir: dir})
	ev := c.Next(t, wait, "Sync", staticpodtest.Is(staticpod.EventSync, ""))
	assert.Empty(t, ev.Pods, "a missing folder is an empty set")

	require.NoError(t, os.MkdirAll(dir, 0o755))
	staticpodtest.WriteManifest(t, dir, "etcd.yaml", podYAML("etcd", "etcd:3"))
	ev = c.Next(t, wait, "Add etcd", staticpodtest.Is(staticpod.EventAdd, "etcd.yaml"))
	assert.Equal(t, "etcd-node-a", ev.Pod.Name)

	t.Run("folder removed and recreated", func(t *testing.T) {
		require.NoError(t, os.RemoveAll(dir))
		c.Next(t, wait, "Remove etcd", staticpodtest.Is(staticpod.EventRemove, "etcd.yaml"))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		staticpodtest.WriteManifest(t, dir, "etcd.yaml", podYAML("etcd", "etcd:3"))
		c.Next(t, wait, "Add etcd again", staticpodtest.Is(staticpod.EventAdd, "etcd.yaml"))
	})
}

func TestWatcherSymlinks(t *testing.T) {
	dir := t.TempDir()
	store := t.TempDir()
	target := staticpodtest.WriteManifest(t, store, "real.yaml", podYAML("linked", "nginx:1"))
	clk := clocktesting.NewFakeClock(time.Now())
	_, c := startWatcher(t, staticpod.Config{Dir: dir, Clock: clk, RescanPeriod: 20 * time.Second})
	c.Next(t, wait, "Sync", staticpodtest.Is(staticpod.EventSync, ""))

	require.NoError(t, os.Symlink(target, filepath.Join(dir, "linked.yaml")))
	ev := c.Next(t, wait, "Add linked", staticpodtest.Is(staticpod.EventAdd, "linked.yaml"))
	assert.Equal(t, "linked-node-a", ev.Pod.Name)

	// An edit to the target happens in another folder, which inotify on the
	// manifest folder cannot see; the periodic rescan picks it up.
	staticpodtest.WriteManifest(t, store, "real.yaml", podYAML("linked", "nginx:2"))
	require.Eventually(t, func() bool {
		clk.Step(20 * time.Second)
		for _, ev := range c.Pending() {
			if ev.Type == staticpod.EventUpdate {
				return true
			}
		}
		return false
	}, wait, 50*time.Millisecond)
	ev = c.Next(t, wait, "Update linked", staticpodtest.Is(staticpod.EventUpdate, "linked.yaml"))
	assert.Equal(t, "nginx:2", ev.Pod.Spec.Containers[0].Image)
}

// TestWatcherConfigMapStyleSwap follows the atomic writer a kubelet uses for
// projected volumes: visible names are symlinks through "..data", which is swapped
// to a new timestamped folder in one rename.
func TestWatcherConfigMapStyleSwap(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "..v1")
	require.NoError(t, os.Mkdir(v1, 0o755))
	staticpodtest.WriteManifest(t, v1, "web.yaml", podYAML("web", "nginx:1"))
	require.NoError(t, os.Symlink("..v1", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink(filepath.Join("..data", "web.yaml"), filepath.Join(dir, "web.yaml")))

	_, c := startWatcher(t, staticpod.Config{Dir: dir})
	ev := c.Next(t, wait, "Sync", staticpodtest.Is(staticpod.EventSync, ""))
	require.Equal(t, []string{"default/web-node-a"}, staticpodtest.Names(ev.Pods))

	v2 := filepath.Join(dir, "..v2")
	require.NoError(t, os.Mkdir(v2, 0o755))
	staticpodtest.WriteManifest(t, v2, "web.yaml", podYAML("web", "nginx:2"))
	require.NoError(t, os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	ev = c.Next(t, wait, "Update web", staticpodtest.Is(staticpod.EventUpdate, "web.yaml"))
	assert.Equal(t, "nginx:2", ev.Pod.Spec.Containers[0].Image)
}

func TestWatcherRunTwice(t *testing.T) {
	w, err := staticpod.New(staticpod.Config{Dir: t.TempDir(), NodeName: "n"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-w.Events() // Sync
	require.ErrorIs(t, w.Run(ctx), staticpod.ErrInvalidConfig)
	cancel()
	require.NoError(t, <-done)
	_, open := <-w.Events()
	assert.False(t, open, "Events is closed when Run returns")
}
