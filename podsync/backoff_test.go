package podsync

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
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
	clk.Step(9 * time.Second)
	b.Next("new", clk.Now())
	b.GC()
	assert.Zero(t, b.Delay("old"), "older than twice the cap: forgotten")
	assert.Equal(t, time.Second, b.Delay("new"))
}

func TestContainerBackoffKey(t *testing.T) {
	pod := testPod()
	assert.Equal(t, "web_default_uid-1_app_1a2b", ContainerBackoffKey(pod, &corev1.Container{Name: "app"}, "1a2b"))
}
