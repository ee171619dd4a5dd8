package main

import (
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
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/util/workqueue"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/cri"
)

// Rotated log names, as the kubelet's container log manager (pkg/kubelet/logs) makes
// them, so that crictl, `kubectl logs` and log shippers that know the kubelet's
// layout find them: the live log is <path>, a rotated one <path>.<stamp> (local
// time, second resolution) and a compressed one <path>.<stamp>.gz; <name>.tmp is a
// compression in progress.
const (
	rotatedStampFormat = "20060102-150405"
	gzipSuffix         = ".gz"
	tmpSuffix          = ".tmp"
)

// logRotateRuntime is what log rotation asks of the CRI runtime.
type logRotateRuntime interface {
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error)
	// ReopenContainerLog makes the runtime close the container's log file and open
	// (create) it again at its path.
	ReopenContainerLog(ctx context.Context, id string) error
}

// criLogRuntime is logRotateRuntime over the agent's CRI client; ReopenContainerLog
// is bounded by the runtime request timeout as the kubelet's remote runtime does.
type criLogRuntime struct {
	*cri.Client
	timeout time.Duration
}

func (r criLogRuntime) ReopenContainerLog(ctx context.Context, id string) error {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	_, err := r.RuntimeService().ReopenContainerLog(ctx, &runtimeapi.ReopenContainerLogRequest{ContainerId: id})
	if err != nil {
		return fmt.Errorf("ReopenContainerLog %q from runtime service failed: %w", id, err)
	}
	return nil
}

// parseLogMaxSize is containerLogMaxSize in bytes (a resource quantity, "10Mi").
func parseLogMaxSize(size string) (int64, error) {
	q, err := resource.ParseQuantity(size)
	if err != nil {
		return 0, err
	}
	n, ok := q.AsInt64()
	if !ok {
		return 0, errors.New("invalid max log size")
	}
	return n, nil
}

// containerLogManager rotates the log files of running containers as the kubelet's
// does: every monitorInterval it queues every running container; workers take them
// one at a time and rotate a log that has reached maxSize. Rotation keeps at most
// maxFiles files per container log: the live one, the one just rotated (left
// uncompressed, the runtime may still be flushing into it and readers finishing it)
// and older rotated ones compressed with gzip.
type containerLogManager struct {
	rt       logRotateRuntime
	maxSize  int64
	maxFiles int
	workers  int
	interval time.Duration
	clock    clock.WithTicker

	// mu keeps a rotation pass and queueing apart, as upstream.
	mu    sync.Mutex
	queue workqueue.TypedInterface[string]
}

// newContainerLogManager builds the manager from containerLogMaxSize,
// containerLogMaxFiles, containerLogMaxWorkers and containerLogMonitorInterval
// (validated by validateConfig). A negative size turns rotation off: nil, as the
// kubelet's stub manager.
func newContainerLogManager(rt logRotateRuntime, c *kubeletv1beta1.KubeletConfiguration, clk clock.WithTicker) (*containerLogManager, error) {
	if c.ContainerLogMaxFiles == nil || *c.ContainerLogMaxFiles <= 1 {
		return nil, fmt.Errorf("invalid MaxFiles %v, must be > 1", c.ContainerLogMaxFiles)
	}
	size, err := parseLogMaxSize(c.ContainerLogMaxSize)
	if err != nil {
		return nil, fmt.Errorf("failed to parse container log max size %q: %w", c.ContainerLogMaxSize, err)
	}
	if size < 0 {
		return nil, nil
	}
	workers := 1
	if c.ContainerLogMaxWorkers != nil {
		workers = int(*c.ContainerLogMaxWorkers)
	}
	interval := 10 * time.Second
	if c.ContainerLogMonitorInterval != nil {
		interval = c.ContainerLogMonitorInterval.Duration
	}
	if workers < 1 || interval <= 0 {
		return nil, fmt.Errorf("invalid containerLogMaxWorkers %d or containerLogMonitorInterval %v", workers, interval)
	}
	return &containerLogManager{
		rt: rt, maxSize: size, maxFiles: int(*c.ContainerLogMaxFiles), workers: workers, interval: interval, clock: clk,
		queue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "kubelet_log_rotate_manager"}),
	}, nil
}

// run rotates until ctx ends, then stops its workers and returns once they have.
func (m *containerLogManager) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	logger.Info("Initializing container log rotate workers", "workers", m.workers, "monitorPeriod", m.interval)
	var wg sync.WaitGroup
	for i := range m.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			logger.V(4).Info("Starting container log rotation worker", "workerID", i+1)
			for m.processNext(ctx, i+1) {
			}
			logger.V(4).Info("Terminating container log rotation worker", "workerID", i+1)
		}()
	}
	defer func() {
		m.queue.ShutDown()
		wg.Wait()
	}()
	t := m.clock.NewTicker(m.interval)
	defer t.Stop()
	for {
		if err := m.queueRunning(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Failed to rotate container logs")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// queueRunning queues every running container for a size check. Exited ones are
// left alone: they write nothing more, and a new empty live log would be useless.
func (m *containerLogManager) queueRunning(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cs, err := m.rt.ListContainers(ctx, &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	})
	if err != nil {
		return fmt.Errorf("failed to list containers: %w", err)
	}
	for _, c := range cs {
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			m.queue.Add(c.GetId())
		}
	}
	return nil
}

// processNext takes one container off the queue and rotates its log when due. It
// returns false once the queue is shut down.
func (m *containerLogManager) processNext(ctx context.Context, worker int) bool {
	id, quit := m.queue.Get()
	if quit {
		return false
	}
	defer m.queue.Done(id)
	if err := m.checkContainer(ctx, id); err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).Error(err, "Failed to rotate log for container", "worker", worker, "containerID", id)
	}
	return true
}

// checkContainer rotates the container's log once it has reached maxSize. A log
// file that is missing (removed by hand) is first reopened by the runtime.
func (m *containerLogManager) checkContainer(ctx context.Context, id string) error {
	st, err := m.rt.ContainerStatus(ctx, id)
	if err != nil {
		return fmt.Errorf("failed to get container status: %w", err)
	}
	if st == nil {
		return errors.New("container status is nil")
	}
	path := st.GetLogPath()
	if path == "" {
		return nil // the container logs nowhere
	}
	info, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		if err := m.rt.ReopenContainerLog(ctx, id); err != nil {
			return fmt.Errorf("container log %s doesn't exist, reopen container log failed: %w", path, err)
		}
		info, err = os.Stat(path)
	}
	if err != nil {
		return fmt.Errorf("failed to stat container log %s: %w", path, err)
	}
	if info.Size() < m.maxSize {
		klog.FromContext(ctx).V(7).Info("log file doesn't need to be rotated", "containerID", id, "path", path, "currentSize", info.Size(), "maxSize", m.maxSize)
		return nil
	}
	if err := m.rotate(ctx, id, path); err != nil {
		return fmt.Errorf("rotate %s (size %d, max %d): %w", path, info.Size(), m.maxSize, err)
	}
	return nil
}

// rotate makes room for one more rotated file (leftovers of failed rotations and
// the oldest files go), compresses the rotated files still plain, then renames the
// live log aside and has the runtime open a new one.
func (m *containerLogManager) rotate(ctx context.Context, id, path string) error {
	pattern := path + ".*"
	rotated, err := filepath.Glob(pattern)
	if err != nil {
		return fmt.Errorf("failed to list all log files with pattern %q: %w", pattern, err)
	}
	inUse, unused := splitUnusedLogs(rotated)
	for _, f := range unused {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("failed to remove unused log %q: %w", f, err)
		}
	}
	keep, excess := excessLogs(inUse, m.maxFiles)
	// Oldest first, so a `kubectl logs` still reading a newer file is not cut short.
	for _, f := range excess {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("failed to remove old log %q: %w", f, err)
		}
	}
	for _, f := range keep {
		if strings.HasSuffix(f, gzipSuffix) {
			continue
		}
		if err := compressLog(f); err != nil {
			return fmt.Errorf("failed to compress log %q: %w", f, err)
		}
	}
	return m.rotateLive(ctx, id, path)
}

// rotateLive renames the live log to <path>.<stamp> and asks the runtime to reopen
// the log. When the runtime cannot, the file is renamed back so the next pass can
// try again (the runtime still writes to it through its open descriptor).
func (m *containerLogManager) rotateLive(ctx context.Context, id, path string) error {
	rotated := path + "." + m.clock.Now().Format(rotatedStampFormat)
	if err := os.Rename(path, rotated); err != nil {
		return fmt.Errorf("failed to rotate log %q to %q: %w", path, rotated, err)
	}
	if err := m.rt.ReopenContainerLog(ctx, id); err != nil {
		if rerr := os.Rename(rotated, path); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Failed to rename rotated log", "rotatedLog", rotated, "newLog", path, "containerID", id)
		}
		return fmt.Errorf("failed to reopen container log %q: %w", id, err)
	}
	return nil
}

// splitUnusedLogs sorts the files matching <path>.* into those still part of the
// log (compressed files and rotated ones not yet compressed) and leftovers of an
// interrupted compression (.tmp files, and plain files whose .gz exists).
func splitUnusedLogs(files []string) (inUse, unused []string) {
	have := make(map[string]bool, len(files))
	for _, f := range files {
		have[f] = true
	}
	for _, f := range files {
		switch {
		case strings.HasSuffix(f, tmpSuffix):
			unused = append(unused, f)
		case strings.HasSuffix(f, gzipSuffix):
			inUse = append(inUse, f)
		case have[f+gzipSuffix]:
			unused = append(unused, f)
		default:
			inUse = append(inUse, f)
		}
	}
	return inUse, unused
}

// excessLogs splits the rotated files, in name (so time) order, into the newest
// maxFiles-2 to keep and the older ones to remove: with the file about to be
// rotated and the new live log, that makes maxFiles.
func excessLogs(rotated []string, maxFiles int) (keep, remove []string) {
	s := append([]string(nil), rotated...)
	sort.Strings(s)
	n := max(maxFiles-2, 0)
	if len(s) <= n {
		return s, nil
	}
	return s[len(s)-n:], s[:len(s)-n]
}

// compressLog gzips path into path.gz (through path.gz.tmp, so a half-written archive
// never carries the final name) and removes path.
func compressLog(path string) (err error) {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("failed to stat log file: %w", err)
	}
	in, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("failed to open log %q: %w", path, err)
	}
	defer in.Close()
	tmp := path + tmpSuffix
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, info.Mode().Perm())
	if err != nil {
		return fmt.Errorf("failed to create temporary log %q: %w", tmp, err)
	}
	defer func() {
		_ = out.Close()
		if err != nil {
			_ = os.Remove(tmp) // best effort: the next rotation removes it otherwise
		}
	}()
	zw := gzip.NewWriter(out)
	if _, err := io.Copy(zw, in); err != nil {
		return fmt.Errorf("failed to compress %q to %q: %w", path, tmp, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("failed to compress %q to %q: %w", path, tmp, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("failed to write %q: %w", tmp, err)
	}
	gz := path + gzipSuffix
	if err := os.Rename(tmp, gz); err != nil {
		return fmt.Errorf("failed to rename %q to %q: %w", tmp, gz, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("failed to remove log %q after compress: %w", path, err)
	}
	return nil
}

// cleanContainerLogs removes a container's log files before the container itself
// goes, as the kubelet's removeContainerLog: the live log and, when rotation is on
// (m not nil), every file of it (<path>*, the rotated and compressed ones too). A
// container the runtime no longer knows has nothing left to find its logs by.
func cleanContainerLogs(ctx context.Context, rt interface {
	ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error)
}, m *containerLogManager, id string) error {
	if m != nil {
		m.mu.Lock()
		defer m.mu.Unlock()
	}
	st, err := rt.ContainerStatus(ctx, id)
	if errors.Is(err, cri.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to get container status %q: %w", id, err)
	}
	path := st.GetLogPath()
	if path == "" {
		return nil
	}
	files := []string{path}
	if m != nil {
		pattern := path + "*"
		if files, err = filepath.Glob(pattern); err != nil {
			return fmt.Errorf("failed to list all log files with pattern %q: %w", pattern, err)
		}
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("failed to remove container %q log %q: %w", id, f, err)
		}
	}
	return nil
}

// logCleaningRuntime is the CRI client the pod syncer removes containers through:
// their log files go first (cleanContainerLogs). Everything else is the client's.
type logCleaningRuntime struct {
	*cri.Client
	logs *containerLogManager
}

func (r logCleaningRuntime) RemoveContainer(ctx context.Context, id string) error {
	if err := cleanContainerLogs(ctx, r.Client, r.logs, id); err != nil {
		return err
	}
	return r.Client.RemoveContainer(ctx, id)
}
