package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestApplyGCPercent(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	t.Setenv("GOGC", "")
	applyGCPercent()
	assert.Equal(t, defaultGCPercent, debug.SetGCPercent(100), "GOGC unset: the kubelet's target")

	t.Setenv("GOGC", "200")
	debug.SetGCPercent(200) // what the runtime read from GOGC at start
	applyGCPercent()
	assert.Equal(t, 200, debug.SetGCPercent(100), "GOGC set: left as the operator asked")
}
