package podsync

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	testingclock "k8s.io/utils/clock/testing"
)

func TestBackoffInBackoffSinceFinish(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	b := NewBackoff(clk)
	const key = "web_default_uid-1_app_abc"

	finished := clk.Now()
	in, _ := b.InBackoff(key, finished)
	assert.False(t, in, "first crash: no back-off recorded, restart at once")
	b.Next(key, finished)

	// Second crash right after the restart: 10s counted from its FinishedAt.
	finished = clk.Now()
	clk.Step(9 * time.Second)
	in, d := b.InBackoff(key, finished)
	assert.True(t, in)
	assert.Equal(t, 10*time.Second, d)
	clk.Step(time.Second)
	in, _ = b.InBackoff(key, finished)
	assert.False(t, in, "10s after the finish the container may start")
}

func TestBackoffSequence(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	b := NewBackoff(clk)
	var got []time.Duration
	for i := 0; i < 7; i++ {
		b.Next("k", clk.Now())
		got = append(got, b.Delay("k"))
		clk.Step(b.Delay("k"))
	}
	assert.Equal(t, []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 300 * time.Second, 300 * time.Second}, got)

	// Within 10 minutes of the last failure the delay stays; beyond, it resets.
	clk.Step(4 * time.Minute) // 9 minutes since the last failure
	b.Next("k", clk.Now())
	assert.Equal(t, 300*time.Second, b.Delay("k"))
	clk.Step(10*time.Minute + time.Second)
	b.Next("k", clk.Now())
	assert.Equal(t, 10*time.Second, b.Delay("k"))

	b.Reset("k")
	assert.Zero(t, b.Delay("k"))
}

func TestBackoffGC(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	b := NewBackoffWith(clk, time.Second, 4*time.Second)
	b.Next("old", clk.Now())
	clk.Step(5 * time.Minute)
	b.Next("new", clk.Now())
	clk.Step(5*time.Minute + time.Second)
	b.GC()
	assert.Zero(t, b.Delay("old"), "10 minutes after its last failure: forgotten")
	assert.Equal(t, time.Second, b.Delay("new"))
}

func TestBackoffWithCustomMax(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	// maxContainerRestartPeriod below the initial delay lowers the initial delay.
	b := NewBackoffWith(clk, 10*time.Second, 5*time.Second)
	b.Next("k", clk.Now())
	assert.Equal(t, 5*time.Second, b.Delay("k"))
	// A 60s maximum still resets after 10 minutes, not 2 x 60s.
	b = NewBackoffWith(clk, 10*time.Second, 60*time.Second)
	for i := 0; i < 4; i++ {
		b.Next("k", clk.Now())
	}
	assert.Equal(t, 60*time.Second, b.Delay("k"))
	clk.Step(9 * time.Minute)
	b.Next("k", clk.Now())
	assert.Equal(t, 60*time.Second, b.Delay("k"), "9 minutes is not enough")
	clk.Step(10*time.Minute + time.Second)
	b.Next("k", clk.Now())
	assert.Equal(t, 10*time.Second, b.Delay("k"))
}

func TestContainerBackoffKey(t *testing.T) {
	pod := testPod()
	app := &corev1.Container{Name: "app", Image: "busybox:1.36"}
	key := ContainerBackoffKey(pod, app)
	assert.Regexp(t, "^[0-9a-f]{1,16}$", key)
	assert.Equal(t, key, ContainerBackoffKey(pod, app.DeepCopy()), "stable")
	other := app.DeepCopy()
	other.Image = "busybox:1.37"
	assert.NotEqual(t, key, ContainerBackoffKey(pod, other), "a new image starts a fresh back-off")
	other = app.DeepCopy()
	other.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
	assert.NotEqual(t, key, ContainerBackoffKey(pod, other), "so do new resources")
	other = app.DeepCopy()
	other.Command = []string{"sh"}
	assert.Equal(t, key, ContainerBackoffKey(pod, other), "other fields do not")
}
