// Package staticpodtest helps tests of code that uses package staticpod: it builds
// valid static pod manifests, writes them the way careful tools do (atomically), and
// collects a Watcher's events so a test can wait for the one it expects.
//
// Nothing here mocks the file system: tests use a real temporary folder, which is
// cheap and exercises inotify for real.
package staticpodtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodekit-dev/nodekit/staticpod"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// NewPod returns a minimal static pod manifest object that loads: apiVersion v1,
// kind Pod, the given name in namespace kube-system, one container running image
// with host networking and the node-critical priority that control-plane static
// pods carry.
func NewPod(name, image string) *corev1.Pod {
	prio := int32(2000001000)
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"component": name}},
		Spec: corev1.PodSpec{
			HostNetwork:       true,
			PriorityClassName: "system-node-critical",
			Priority:          &prio,
			Containers:        []corev1.Container{{Name: name, Image: image, Command: []string{name}}},
		},
	}
}

// Marshal renders a pod as manifest YAML. It fails the test on error.
func Marshal(tb testing.TB, pod *corev1.Pod) []byte {
	tb.Helper()
	data, err := yaml.Marshal(pod)
	if err != nil {
		tb.Fatalf("staticpodtest: marshal %s: %v", pod.Name, err)
	}
	return data
}

// WriteManifest writes data to dir/name atomically: into a dotfile (which the
// loader ignores) that is then renamed over the target, as kubeadm does. The
// watcher sees one complete file, never a half-written one.
func WriteManifest(tb testing.TB, dir, name string, data []byte) string {
	tb.Helper()
	target := filepath.Join(dir, name)
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		tb.Fatalf("staticpodtest: write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		tb.Fatalf("staticpodtest: rename %s to %s: %v", tmp, target, err)
	}
	return target
}

// WritePod marshals pod and writes it with WriteManifest.
func WritePod(tb testing.TB, dir, name string, pod *corev1.Pod) string {
	tb.Helper()
	return WriteManifest(tb, dir, name, Marshal(tb, pod))
}

// Collector records every event of a staticpod.Watcher in a goroutine, so the
// watcher never blocks on a slow test, and lets the test wait for events.
type Collector struct {
	mu     sync.Mutex
	cond   *sync.Cond
	events []staticpod.Event
	closed bool
	next   int
}

// Collect starts reading ch until it closes (when the watcher's Run returns).
func Collect(ch <-chan staticpod.Event) *Collector {
	c := &Collector{}
	c.cond = sync.NewCond(&c.mu)
	go func() {
		for ev := range ch {
			c.mu.Lock()
			c.events = append(c.events, ev)
			c.mu.Unlock()
			c.cond.Broadcast()
		}
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.cond.Broadcast()
	}()
	return c
}

// Events returns a copy of every event received so far.
func (c *Collector) Events() []staticpod.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]staticpod.Event(nil), c.events...)
}

// Next waits up to timeout for the first not yet consumed event that match
// accepts, consuming it and every event before it. It fails the test on timeout,
// listing what did arrive.
func (c *Collector) Next(tb testing.TB, timeout time.Duration, what string, match func(staticpod.Event) bool) staticpod.Event {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, c.cond.Broadcast)
	defer timer.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for i := c.next; i < len(c.events); i++ {
			if match(c.events[i]) {
				c.next = i + 1
				return c.events[i]
			}
		}
		if c.closed || !time.Now().Before(deadline) {
			tb.Fatalf("staticpodtest: no %s event within %v; got %s", what, timeout, describe(c.events[c.next:]))
			return staticpod.Event{}
		}
		c.cond.Wait()
	}
}

// Pending returns the events not yet consumed by Next.
func (c *Collector) Pending() []staticpod.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]staticpod.Event(nil), c.events[c.next:]...)
}

// Is matches events of type t for file base name file ("" matches any file).
func Is(t staticpod.EventType, file string) func(staticpod.Event) bool {
	return func(ev staticpod.Event) bool {
		return ev.Type == t && (file == "" || filepath.Base(ev.Path) == file)
	}
}

func describe(evs []staticpod.Event) string {
	if len(evs) == 0 {
		return "nothing"
	}
	parts := make([]string, 0, len(evs))
	for _, ev := range evs {
		s := ev.Type.String()
		if ev.Path != "" {
			s += " " + filepath.Base(ev.Path)
		}
		if ev.Err != nil {
			s += fmt.Sprintf(" (%v)", ev.Err)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// Names returns the namespace/name of each pod, for compact assertions.
func Names(pods []*corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}
