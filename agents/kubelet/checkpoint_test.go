package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// captureKlog sends klog's output to a buffer for the rest of the test.
func captureKlog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return &buf
}

func requests(cpu, mem string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem),
	}}
}

func TestResourceCheckpointRoundTrip(t *testing.T) {
	dir := t.TempDir()
	c := openResourceCheckpoint(dir, allocatedPodsStateFile)
	_, ok := c.containers("pod1")
	assert.False(t, ok)
	require.NoError(t, c.setContainers("pod1", map[string]corev1.ResourceRequirements{"container1": requests("1Ki", "1Ki")}))

	// Written at once, in upstream's format: the entries as a JSON string, and
	// the checkpointmanager's checksum of that string.
	b, err := os.ReadFile(filepath.Join(dir, "allocated_pods_state"))
	require.NoError(t, err)
	const data = `{"entries":{"pod1":{"ContainerResources":{"container1":{"requests":{"cpu":"1Ki","memory":"1Ki"}}},"PodLevelResources":null,"EmptyDirVolumeLimits":null}}}`
	want, err := json.Marshal(map[string]any{"data": data, "checksum": checkpointChecksum(data)})
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(b))
	assert.Equal(t, `{"data":`, string(b[:8]), "data comes first, as upstream writes it")

	require.NoError(t, c.setContainers("pod2", map[string]corev1.ResourceRequirements{"a": requests("100m", "32Mi"), "b": requests("1", "1Gi")}))
	again := openResourceCheckpoint(dir, allocatedPodsStateFile)
	assert.ElementsMatch(t, []k8stypes.UID{"pod1", "pod2"}, again.uids())
	got, ok := again.containers("pod2")
	require.True(t, ok)
	assert.True(t, resource.MustParse("1Gi").Equal(got["b"].Requests[corev1.ResourceMemory]))
	assert.True(t, resource.MustParse("100m").Equal(got["a"].Requests[corev1.ResourceCPU]))

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left behind")
}

// A file upstream's kubelet wrote (the checkpoint of upstream's
// Test_stateCheckpoint_formatUpgraded) is read: the checksums agree.
func TestResourceCheckpointReadsUpstreamFile(t *testing.T) {
	dir := t.TempDir()
	const upstream = `{"data":"{\"entries\":{\"pod1\":{\"ContainerResources\":{\"container1\":{\"requests\":{\"cpu\":\"1Ki\",\"memory\":\"1Ki\"}}}}}}","checksum":1178570812}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, actuatedPodsStateFile), []byte(upstream), 0o600))
	c := openResourceCheckpoint(dir, actuatedPodsStateFile)
	got, ok := c.PodActuated("pod1")
	require.True(t, ok)
	assert.Equal(t, map[string]corev1.ResourceRequirements{"container1": requests("1Ki", "1Ki")}, got)
}

func TestResourceCheckpointMissingOrCorrupt(t *testing.T) {
	for _, tt := range []struct {
		name, content string
		want          string
	}{
		{name: "missing"},
		{name: "not JSON", content: "{oops", want: "invalid character"},
		{name: "checksum mismatch", content: `{"data":"{\"entries\":{\"pod1\":{}}}","checksum":1}`, want: "is corrupted: checksum 1, data hashes to"},
		{name: "data not JSON", content: `{"data":"nope","checksum":` + jsonNumber(checkpointChecksum("nope")) + `}`, want: "data: invalid character"},
		{name: "empty file", content: " ", want: "unexpected end of JSON input"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logs := captureKlog(t)
			dir := t.TempDir()
			path := filepath.Join(dir, allocatedPodsStateFile)
			if tt.content != "" {
				require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			}
			c := openResourceCheckpoint(dir, allocatedPodsStateFile)
			assert.Empty(t, c.uids(), "starts empty")
			klog.Flush()
			if tt.want == "" {
				assert.NotContains(t, logs.String(), "Could not restore")
				_, err := os.Stat(path)
				assert.ErrorIs(t, err, os.ErrNotExist, "nothing written before a change")
			} else {
				assert.Contains(t, logs.String(), "Could not restore pod resource state from checkpoint")
				assert.Contains(t, logs.String(), `checkpointPath="`+path+`"`)
				assert.Contains(t, logs.String(), tt.want)
			}

			// The next change replaces the file with a good one.
			require.NoError(t, c.setContainers("pod9", map[string]corev1.ResourceRequirements{"c": requests("1", "1Mi")}))
			again := openResourceCheckpoint(dir, allocatedPodsStateFile)
			assert.Equal(t, []k8stypes.UID{"pod9"}, again.uids())
		})
	}
}

func jsonNumber(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestResourceCheckpointRemoval(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, actuatedPodsStateFile)
	c := openResourceCheckpoint(dir, actuatedPodsStateFile)
	for _, uid := range []k8stypes.UID{"gone", "stays", "removed"} {
		c.SetPodActuated(uid, map[string]corev1.ResourceRequirements{"c": requests("100m", "1Mi")})
	}
	c.removeOrphans(func(uid k8stypes.UID) bool { return uid != "gone" })
	c.RemovePodActuated("removed")
	assert.Equal(t, []k8stypes.UID{"stays"}, c.uids())

	// Removal alone does not write (as upstream: a stale entry is harmless)...
	assert.ElementsMatch(t, []k8stypes.UID{"gone", "stays", "removed"}, openResourceCheckpoint(dir, actuatedPodsStateFile).uids())
	// ...the next change writes without the removed pods.
	c.SetPodActuated("new", map[string]corev1.ResourceRequirements{"c": requests("1", "1Mi")})
	assert.ElementsMatch(t, []k8stypes.UID{"stays", "new"}, openResourceCheckpoint(dir, actuatedPodsStateFile).uids())

	// An unchanged record is not written again.
	require.NoError(t, os.Remove(path))
	c.SetPodActuated("new", map[string]corev1.ResourceRequirements{"c": requests("1", "1Mi")})
	_, err := os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestResourceCheckpointWriteFailureNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o600))
	c := openResourceCheckpoint(notDir, allocatedPodsStateFile)
	err := c.setContainers("pod1", map[string]corev1.ResourceRequirements{"c": requests("1", "1Mi")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(notDir, allocatedPodsStateFile))
	_, ok := c.containers("pod1")
	assert.True(t, ok, "the record holds in memory")
}

// After a restart the allocation comes from the checkpoint: a resize that was
// not admitted stays unallocated.
func TestAllocationsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	a := newAllocations(nil, openResourceCheckpoint(dir, allocatedPodsStateFile))
	a.set(resizePod("100m", 1))

	restarted := newAllocations(nil, openResourceCheckpoint(dir, allocatedPodsStateFile))
	got, differs := restarted.pod(resizePod("300m", 2))
	require.True(t, differs, "the spec's 300m is not the allocation")
	q := got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]
	assert.Equal(t, "100m", q.String())
}
