package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/dump"

	"github.com/nodekit-dev/nodekit/podsync"
)

// The in-place resize records the kubelet keeps in its root dir (the
// allocation manager's allocatedPodsStateFile and the runtime manager's
// actuatedPodsStateFile), so that a restart neither takes a Deferred resize as
// allocated nor re-actuates one already carried out.
const (
	allocatedPodsStateFile = "allocated_pods_state"
	actuatedPodsStateFile  = "actuated_pods_state"
)

// podResourceInfo is one pod's record: its containers' resources by name.
// The fields, their names and their lack of JSON tags are upstream's
// state.PodResourceInfo, so the file reads the same both ways; nodekit never
// sets the pod-level or emptyDir ones (those resizes are not supported) but
// keeps what it reads.
type podResourceInfo struct {
	ContainerResources   map[string]corev1.ResourceRequirements
	PodLevelResources    *corev1.ResourceRequirements
	EmptyDirVolumeLimits map[string]*resource.Quantity
}

// checkpointData is the JSON held, as a string, in checkpointFile.Data.
type checkpointData struct {
	Entries map[types.UID]podResourceInfo `json:"entries,omitempty"`
}

// checkpointFile is the file: the data and its checksum, as the kubelet's
// checkpointmanager writes it.
type checkpointFile struct {
	Data     string `json:"data"`
	Checksum uint64 `json:"checksum"`
}

// checkpointChecksum is the checkpointmanager's checksum: FNV-32a over the
// data as k8s.io/utils/dump.ForHash prints it.
func checkpointChecksum(data string) uint64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(data))
	return uint64(h.Sum32())
}

// resourceCheckpoint is a pod resource record kept in memory and written to
// its file on every change, as upstream's stateCheckpoint. Removing a pod
// changes only memory (upstream's RemovePod and RemoveOrphanedPods do not
// write either: a stale entry is harmless and goes with the next write).
// Records are never changed in place once stored, so readers may keep them.
type resourceCheckpoint struct {
	path string

	mu      sync.Mutex
	pods    map[types.UID]podResourceInfo
	lastSum uint64 // of the last data written or read: an unchanged record is not rewritten
	written bool
}

var _ podsync.ActuatedStore = (*resourceCheckpoint)(nil)

// openResourceCheckpoint restores the record from dir/name. A missing file
// starts it empty. A file that cannot be read or parsed, or whose checksum does
// not match, is logged with its path and the record starts empty too: upstream
// refuses to start there (the operator is to drain the node and delete the
// file), but a kubelet that does not start stops every pod's status and the
// node's heartbeat, a far larger harm than resize records lost. The file is
// overwritten by the next change.
func openResourceCheckpoint(dir, name string) *resourceCheckpoint {
	c := &resourceCheckpoint{path: filepath.Join(dir, name), pods: map[types.UID]podResourceInfo{}}
	pods, sum, err := readResourceCheckpoint(c.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		klog.ErrorS(err, "Could not restore pod resource state from checkpoint, starting with none; the file is replaced on the next change", "checkpointPath", c.path)
	default:
		c.pods, c.lastSum, c.written = pods, sum, true
		klog.V(2).InfoS("State checkpoint: restored pod resource state from checkpoint", "checkpointPath", c.path, "pods", len(pods))
	}
	return c
}

func readResourceCheckpoint(path string) (map[types.UID]podResourceInfo, uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	var f checkpointFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, 0, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if sum := checkpointChecksum(f.Data); sum != f.Checksum {
		return nil, 0, fmt.Errorf("checkpoint %s is corrupted: checksum %d, data hashes to %d", path, f.Checksum, sum)
	}
	var d checkpointData
	if err := json.Unmarshal([]byte(f.Data), &d); err != nil {
		return nil, 0, fmt.Errorf("checkpoint %s: data: %w", path, err)
	}
	if d.Entries == nil {
		d.Entries = map[types.UID]podResourceInfo{}
	}
	return d.Entries, f.Checksum, nil
}

// containers returns the pod's container record, false when there is none.
// The map must not be changed.
func (c *resourceCheckpoint) containers(uid types.UID) (map[string]corev1.ResourceRequirements, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.pods[uid]
	return p.ContainerResources, ok
}

// setContainers records the pod's containers' resources (a copy of them) and
// writes the file.
func (c *resourceCheckpoint) setContainers(uid types.UID, containers map[string]corev1.ResourceRequirements) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pods[uid]
	p.ContainerResources = make(map[string]corev1.ResourceRequirements, len(containers))
	for name, r := range containers {
		p.ContainerResources[name] = *r.DeepCopy()
	}
	c.pods[uid] = p
	return c.store()
}

// remove forgets the pod in memory.
func (c *resourceCheckpoint) remove(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pods, uid)
}

// removeOrphans forgets, in memory, every pod keep does not report as still
// on the node (RemoveOrphanedPods).
func (c *resourceCheckpoint) removeOrphans(keep func(types.UID) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid := range c.pods {
		if !keep(uid) {
			delete(c.pods, uid)
		}
	}
}

// uids lists the pods with a record.
func (c *resourceCheckpoint) uids() []types.UID {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]types.UID, 0, len(c.pods))
	for uid := range c.pods {
		out = append(out, uid)
	}
	return out
}

// store writes the record when it changed since the last write; the caller
// holds c.mu.
func (c *resourceCheckpoint) store() error {
	data, err := json.Marshal(checkpointData{Entries: c.pods})
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", c.path, err)
	}
	f := checkpointFile{Data: string(data), Checksum: checkpointChecksum(string(data))}
	if c.written && f.Checksum == c.lastSum {
		return nil
	}
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", c.path, err)
	}
	if err := writeFileAtomic(c.path, b); err != nil {
		return err
	}
	c.lastSum, c.written = f.Checksum, true
	return nil
}

// writeFileAtomic replaces path with data through a synced temporary file in
// the same directory, so a crash leaves the old file or the new one, never a
// part of either.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// PodActuated, SetPodActuated and RemovePodActuated make the actuated record a
// podsync.ActuatedStore.

func (c *resourceCheckpoint) PodActuated(uid types.UID) (map[string]corev1.ResourceRequirements, bool) {
	m, ok := c.containers(uid)
	if !ok {
		return nil, false
	}
	out := make(map[string]corev1.ResourceRequirements, len(m))
	for name, r := range m {
		out[name] = *r.DeepCopy()
	}
	return out, true
}

func (c *resourceCheckpoint) SetPodActuated(uid types.UID, containers map[string]corev1.ResourceRequirements) {
	if err := c.setContainers(uid, containers); err != nil {
		klog.ErrorS(err, "Failed to save pod resource information checkpoint", "podUID", uid)
	}
}

func (c *resourceCheckpoint) RemovePodActuated(uid types.UID) { c.remove(uid) }
