package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/cri"
)

// fakeLogRuntime is a runtime whose containers log to files in a test folder:
// ReopenContainerLog creates the log file again, as containerd does.
type fakeLogRuntime struct {
	mu        sync.Mutex
	ctrs      map[string]*runtimeapi.ContainerStatus
	reopenErr error
	statusErr error
	reopened  []string
	listed    chan struct{}
}

func (f *fakeLogRuntime) add(id, path string, state runtimeapi.ContainerState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctrs == nil {
		f.ctrs = map[string]*runtimeapi.ContainerStatus{}
	}
	f.ctrs[id] = &runtimeapi.ContainerStatus{Id: id, State: state, LogPath: path}
}

func (f *fakeLogRuntime) ListContainers(_ context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*runtimeapi.Container
	for id, st := range f.ctrs {
		if filter.GetState() != nil && filter.GetState().GetState() != st.GetState() {
			continue
		}
		out = append(out, &runtimeapi.Container{Id: id, State: st.GetState()})
	}
	if f.listed != nil {
		f.listed <- struct{}{}
	}
	return out, nil
}

func (f *fakeLogRuntime) ContainerStatus(_ context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.statusErr != nil {
		return nil, f.statusErr
	}
	st, ok := f.ctrs[id]
	if !ok {
		return nil, fmt.Errorf("%w: no such container %s", cri.ErrNotFound, id)
	}
	return st, nil
}

func (f *fakeLogRuntime) ReopenContainerLog(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reopened = append(f.reopened, id)
	if f.reopenErr != nil {
		return f.reopenErr
	}
	fh, err := os.OpenFile(f.ctrs[id].GetLogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	return fh.Close()
}

func (f *fakeLogRuntime) reopens() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reopened...)
}

func logRotateConfig(maxSize string, maxFiles int32) *kubeletv1beta1.KubeletConfiguration {
	return &kubeletv1beta1.KubeletConfiguration{
		ContainerLogMaxSize: maxSize, ContainerLogMaxFiles: ptr.To(maxFiles),
		ContainerLogMaxWorkers: ptr.To[int32](1), ContainerLogMonitorInterval: &metav1.Duration{Duration: 10 * time.Second},
	}
}

// rotateFixture is a manager over a fake runtime with one running container whose
// log is dir/0.log, and a fake clock at 2026-12-03 10:20:30 local time.
type rotateFixture struct {
	m     *containerLogManager
	rt    *fakeLogRuntime
	clock *clocktesting.FakeClock
	dir   string
	log   string
}

func newRotateFixture(t *testing.T, maxSize string, maxFiles int32) *rotateFixture {
	t.Helper()
	f := &rotateFixture{rt: &fakeLogRuntime{}, dir: t.TempDir()}
	f.clock = clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 20, 30, 0, time.Local))
	f.log = filepath.Join(f.dir, "0.log")
	f.rt.add("c1", f.log, runtimeapi.ContainerState_CONTAINER_RUNNING)
	m, err := newContainerLogManager(f.rt, logRotateConfig(maxSize, maxFiles), f.clock)
	require.NoError(t, err)
	require.NotNil(t, m)
	f.m = m
	return f
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o640))
}

func (f *rotateFixture) files(t *testing.T) []string {
	t.Helper()
	es, err := os.ReadDir(f.dir)
	require.NoError(t, err)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	out, err := io.ReadAll(zr)
	require.NoError(t, err)
	return string(out)
}

func TestLogRotateBelowSizeLeavesLogAlone(t *testing.T) {
	f := newRotateFixture(t, "100", 5)
	writeFile(t, f.log, strings.Repeat("a", 99))
	require.NoError(t, f.m.checkContainer(context.Background(), "c1"))
	assert.Equal(t, []string{"0.log"}, f.files(t))
	assert.Empty(t, f.rt.reopens())
}

func TestLogRotateAtSizeRenamesAndReopens(t *testing.T) {
	f := newRotateFixture(t, "100", 5)
	writeFile(t, f.log, strings.Repeat("a", 100))
	require.NoError(t, f.m.checkContainer(context.Background(), "c1"))
	// The live log is renamed with the clock's local time and reopened empty; the
	// newest rotated file stays plain.
	assert.Equal(t, []string{"0.log", "0.log.20261203-102030"}, f.files(t))
	assert.Equal(t, []string{"c1"}, f.rt.reopens())
	b, err := os.ReadFile(f.log)
	require.NoError(t, err)
	assert.Empty(t, b)
	b, err = os.ReadFile(f.log + ".20261203-102030")
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("a", 100), string(b))
}

func TestLogRotateCompressesOlderAndKeepsMaxFiles(t *testing.T) {
	f := newRotateFixture(t, "10", 4)
	ctx := context.Background()
	// Four rounds, a minute apart, each with its own content.
	for i, c := range []string{"first-----", "second----", "third-----", "fourth----"} {
		writeFile(t, f.log, c)
		require.NoError(t, f.m.checkContainer(ctx, "c1"), "round %d", i)
		f.clock.Step(time.Minute)
	}
	// maxFiles 4: the live log, the newest rotated one plain, two older compressed;
	// the first round's file is gone.
	assert.Equal(t, []string{"0.log", "0.log.20261203-102130.gz", "0.log.20261203-102230.gz", "0.log.20261203-102330"}, f.files(t))
	assert.Equal(t, "second----", gunzip(t, filepath.Join(f.dir, "0.log.20261203-102130.gz")))
	assert.Equal(t, "third-----", gunzip(t, filepath.Join(f.dir, "0.log.20261203-102230.gz")))
	b, err := os.ReadFile(filepath.Join(f.dir, "0.log.20261203-102330"))
	require.NoError(t, err)
	assert.Equal(t, "fourth----", string(b))
	// The compressed file keeps the log's mode.
	st, err := os.Stat(filepath.Join(f.dir, "0.log.20261203-102130.gz"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm())
}

func TestLogRotateMaxFilesTwoKeepsOnlyTheNewestRotated(t *testing.T) {
	f := newRotateFixture(t, "1", 2)
	for range 3 {
		writeFile(t, f.log, "x")
		require.NoError(t, f.m.checkContainer(context.Background(), "c1"))
		f.clock.Step(time.Second)
	}
	assert.Equal(t, []string{"0.log", "0.log.20261203-102032"}, f.files(t))
}

func TestLogRotateRemovesLeftoversOfFailedCompression(t *testing.T) {
	f := newRotateFixture(t, "10", 5)
	// An interrupted compression: the temporary archive, and a plain file whose
	// archive was finished but which was not removed yet.
	writeFile(t, f.log+".20261203-090000.gz.tmp", "half")
	writeFile(t, f.log+".20261203-091000", "done")
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write([]byte("done"))
	require.NoError(t, zw.Close())
	writeFile(t, f.log+".20261203-091000.gz", zb.String())
	writeFile(t, f.log, strings.Repeat("b", 10))
	require.NoError(t, f.m.checkContainer(context.Background(), "c1"))
	assert.Equal(t, []string{"0.log", "0.log.20261203-091000.gz", "0.log.20261203-102030"}, f.files(t))
	assert.Equal(t, "done", gunzip(t, filepath.Join(f.dir, "0.log.20261203-091000.gz")))
}

func TestLogRotateReopenFailureRenamesBack(t *testing.T) {
	f := newRotateFixture(t, "10", 5)
	f.rt.reopenErr = errors.New("runtime says no")
	writeFile(t, f.log, strings.Repeat("c", 10))
	err := f.m.checkContainer(context.Background(), "c1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "runtime says no")
	assert.Contains(t, err.Error(), f.log)
	// Nothing lost: the log is back at its name for the next round.
	assert.Equal(t, []string{"0.log"}, f.files(t))
	b, err := os.ReadFile(f.log)
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("c", 10), string(b))
}

func TestLogRotateMissingLogIsReopened(t *testing.T) {
	f := newRotateFixture(t, "10", 5)
	require.NoError(t, f.m.checkContainer(context.Background(), "c1"))
	assert.Equal(t, []string{"c1"}, f.rt.reopens())
	assert.Equal(t, []string{"0.log"}, f.files(t))

	f.rt.reopenErr = errors.New("gone")
	require.NoError(t, os.Remove(f.log))
	err := f.m.checkContainer(context.Background(), "c1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "doesn't exist, reopen container log failed")
}

func TestLogRotateUnknownContainerNamesIt(t *testing.T) {
	f := newRotateFixture(t, "10", 5)
	err := f.m.checkContainer(context.Background(), "nope")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nope")
}

func TestLogRotateRunQueuesRunningContainersEachInterval(t *testing.T) {
	f := newRotateFixture(t, "10", 5)
	f.rt.listed = make(chan struct{})
	exited := filepath.Join(f.dir, "exited.log")
	f.rt.add("c2", exited, runtimeapi.ContainerState_CONTAINER_EXITED)
	writeFile(t, exited, strings.Repeat("e", 50))
	writeFile(t, f.log, strings.Repeat("a", 10))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.m.run(ctx)
	}()
	waitListed := func() {
		t.Helper()
		select {
		case <-f.rt.listed:
		case <-time.After(10 * time.Second):
			t.Fatal("no listing of containers")
		}
	}
	waitReopens := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(f.rt.reopens()) == n }, 10*time.Second, time.Millisecond)
	}
	waitListed() // the first pass runs at once
	waitReopens(1)
	assert.Equal(t, []string{"0.log", "0.log.20261203-102030", "exited.log"}, f.files(t))
	// The next pass only after the interval.
	writeFile(t, f.log, strings.Repeat("b", 10))
	require.Eventually(t, f.clock.HasWaiters, 10*time.Second, time.Millisecond)
	select {
	case <-f.rt.listed:
		t.Fatal("a second pass before the interval")
	case <-time.After(50 * time.Millisecond):
	}
	f.clock.Step(10 * time.Second)
	waitListed()
	waitReopens(2)
	assert.Equal(t, []string{"0.log", "0.log.20261203-102030.gz", "0.log.20261203-102040", "exited.log"}, f.files(t))
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	// The exited container's log was never touched.
	assert.NotContains(t, f.rt.reopens(), "c2")
	b, err := os.ReadFile(exited)
	require.NoError(t, err)
	assert.Len(t, b, 50)
}

func TestNewContainerLogManager(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	m, err := newContainerLogManager(&fakeLogRuntime{}, logRotateConfig("-1", 5), clk)
	require.NoError(t, err)
	assert.Nil(t, m, "a negative containerLogMaxSize turns rotation off")

	_, err = newContainerLogManager(&fakeLogRuntime{}, logRotateConfig("10Mi", 1), clk)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid MaxFiles")

	_, err = newContainerLogManager(&fakeLogRuntime{}, logRotateConfig("ten", 5), clk)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `failed to parse container log max size "ten"`)

	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	m, err = newContainerLogManager(&fakeLogRuntime{}, cfg, clk)
	require.NoError(t, err)
	// The kubelet's defaults.
	assert.Equal(t, int64(10<<20), m.maxSize)
	assert.Equal(t, 5, m.maxFiles)
	assert.Equal(t, 1, m.workers)
	assert.Equal(t, 10*time.Second, m.interval)
}

func TestCleanContainerLogs(t *testing.T) {
	for _, rotation := range []bool{true, false} {
		t.Run(fmt.Sprintf("rotation %v", rotation), func(t *testing.T) {
			f := newRotateFixture(t, "10", 5)
			m := f.m
			if !rotation {
				m = nil
			}
			for _, name := range []string{"0.log", "0.log.20261203-090000.gz", "0.log.20261203-091000", "1.log", "10.log"} {
				writeFile(t, filepath.Join(f.dir, name), "x")
			}
			require.NoError(t, cleanContainerLogs(context.Background(), f.rt, m, "c1"))
			if rotation {
				// Every file of the container's log; the next attempt's are not its.
				assert.Equal(t, []string{"1.log", "10.log"}, f.files(t))
			} else {
				assert.Equal(t, []string{"0.log.20261203-090000.gz", "0.log.20261203-091000", "1.log", "10.log"}, f.files(t))
			}
			// A container the runtime no longer knows: nothing to do.
			require.NoError(t, cleanContainerLogs(context.Background(), f.rt, m, "gone"))
			f.rt.statusErr = errors.New("runtime down")
			err := cleanContainerLogs(context.Background(), f.rt, m, "c1")
			require.Error(t, err)
			assert.Contains(t, err.Error(), `failed to get container status "c1"`)
		})
	}
}
