package podsync

import (
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
)

// The kubelet's back-off bounds, for container restarts (CrashLoopBackOff) and
// image pulls (ImagePullBackOff) alike.
const (
	// DefaultBackoffInitial is the first delay after a failure.
	DefaultBackoffInitial = 10 * time.Second
	// DefaultBackoffMax caps the delay, which doubles at each failure.
	DefaultBackoffMax = 300 * time.Second
)

// Backoff keeps one delay per key, doubling from Initial to Max, with the
// kubelet's rule for forgetting: a key whose last failure is more than
// BackoffReset (10 minutes) older than the event being judged starts again from
// Initial. It is client-go's flowcontrol.Backoff, the type the kubelet itself
// uses, on an injected clock. Safe for concurrent use.
type Backoff struct {
	b *flowcontrol.Backoff
}

// NewBackoff returns a Backoff on clk (nil means the real clock) with the
// kubelet's bounds, 10s doubling to 300s.
func NewBackoff(clk clock.Clock) *Backoff {
	return NewBackoffWith(clk, DefaultBackoffInitial, DefaultBackoffMax)
}

// BackoffReset is how long after its last failure a key is forgotten: the
// kubelet's crash-loop back-off uses a fixed 10 minutes whatever its maximum
// (kubelet.go sets HasExpiredFunc so), which is also twice the image back-off's
// 300s maximum.
const BackoffReset = 10 * time.Minute

// NewBackoffWith returns a Backoff with other bounds, for the kubelet's
// crashLoopBackOff.maxContainerRestartPeriod (KubeletCrashLoopBackOffMax, on by
// default): as the kubelet does, an initial delay above the maximum is lowered
// to it. Non-positive values take the defaults. Keys are still forgotten
// BackoffReset after their last failure.
func NewBackoffWith(clk clock.Clock, initial, maxDelay time.Duration) *Backoff {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if initial <= 0 {
		initial = DefaultBackoffInitial
	}
	if maxDelay <= 0 {
		maxDelay = DefaultBackoffMax
	}
	if maxDelay < initial {
		initial = maxDelay
	}
	b := flowcontrol.NewFakeBackOff(initial, maxDelay, clk)
	b.HasExpiredFunc = func(eventTime, lastUpdate time.Time, _ time.Duration) bool {
		return eventTime.Sub(lastUpdate) > BackoffReset
	}
	return &Backoff{b: b}
}

// InBackoff reports whether key is still waiting out its delay, counted from
// since (a container's FinishedAt), and the delay in force.
func (b *Backoff) InBackoff(key string, since time.Time) (bool, time.Duration) {
	return b.b.IsInBackOffSince(key, since), b.b.Get(key)
}

// InBackoffSinceUpdate reports whether key's delay, counted from its last
// recorded failure, runs past eventTime (the image pull back-off's check).
func (b *Backoff) InBackoffSinceUpdate(key string, eventTime time.Time) bool {
	return b.b.IsInBackOffSinceUpdate(key, eventTime)
}

// Next records a failure of key at since: the first failure, or the first after
// the key was forgotten, sets the delay to Initial, each later one doubles it up
// to Max.
func (b *Backoff) Next(key string, since time.Time) {
	b.b.Next(key, since)
}

// Delay returns the delay in force for key (0 when it has none).
func (b *Backoff) Delay(key string) time.Duration { return b.b.Get(key) }

// Reset forgets key.
func (b *Backoff) Reset(key string) { b.b.Reset(key) }

// GC forgets every key whose last failure is older than BackoffReset. Call it
// now and then (the kubelet does on its housekeeping) to bound memory.
func (b *Backoff) GC() { b.b.GC() }

// ContainerBackoffKey is the key the kubelet uses for a container's restart
// back-off (kuberuntime GetBackoffKey, v1.37.2): FNV-64a, in hex, over the pod's
// name, namespace and UID and the container's name, image and resources joined
// with "/", so a changed image or resources starts with a fresh delay.
func ContainerBackoffKey(pod *corev1.Pod, container *corev1.Container) string {
	key := strings.Join([]string{
		pod.Name, pod.Namespace, string(pod.UID), container.Name, container.Image, container.Resources.String(),
	}, "/")
	h := fnv.New64a()
	h.Write([]byte(key))
	return strconv.FormatUint(h.Sum64(), 16)
}
