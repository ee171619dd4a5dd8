package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigWatcher: a write to the --config file ends the agent with upstream's
// error; a chmod does not; cancelling returns nil.
func TestConfigWatcher(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte("kind: KubeProxyConfiguration\n"), 0o644))
	run := func(ctx context.Context) chan error {
		cw, err := newConfigWatcher(path)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- cw.run(ctx) }()
		return done
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := run(ctx)
	require.NoError(t, os.Chmod(path, 0o600))
	select {
	case err := <-done:
		t.Fatalf("a chmod ended the watch: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, os.WriteFile(path, []byte("kind: KubeProxyConfiguration\nmode: iptables\n"), 0o644))
	select {
	case err := <-done:
		assert.True(t, errors.Is(err, errConfigFileChanged), "got %v", err)
		assert.EqualError(t, err, "content of the proxy server's configuration file was updated")
	case <-time.After(10 * time.Second):
		t.Fatal("a write did not end the watch")
	}
	cancel()

	ctx, cancel = context.WithCancel(context.Background())
	done = run(ctx)
	cancel()
	assert.NoError(t, <-done)

	_, err := newConfigWatcher(filepath.Join(t.TempDir(), "missing.yaml"))
	assert.ErrorContains(t, err, "missing.yaml")
}
