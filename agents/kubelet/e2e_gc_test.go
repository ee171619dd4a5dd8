package main_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestKubeletGarbageCollection runs the kubelet binary with real containerd and a
// real control plane, the GC periods shortened (5s containers, 3s images):
//
//   - a crash-looping container leaves at most one dead container in the runtime
//     (--maximum-dead-containers-per-container 1, the default) while its restartCount
//     keeps rising, and `kubectl logs --previous` still reads the last run;
//   - restarted with image GC thresholds computed from the image file system's real
//     usage so that it is over the high one, the kubelet removes an unused image,
//     keeps the busybox image the pod's containers use and the sandbox (pause) image,
//     logs the kubelet's "over the high threshold" line and, unable to reach the low
//     threshold, records FreeDiskSpaceFailed on the node.
func TestKubeletGarbageCollection(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	egress := &nodeEgress{}
	cp := controlplane.Start(t, controlplane.Options{ClusterEgress: egress.dial})
	n := startNodeWith(t, cp, "nk-gc", true, nodeOptions{
		env: []string{"NODEKIT_KUBELET_CONTAINER_GC_PERIOD=5s", "NODEKIT_KUBELET_IMAGE_GC_PERIOD=3s"},
	})
	egress.set(n.env.Node)
	admin := cp.AdminKubeconfig()
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)

	// Each run prints a line of its own, then fails.
	n.createPod(t, busyboxPod("crash", n.ctd.BusyboxImage(), corev1.RestartPolicyAlways,
		`echo "run $(cat /proc/sys/kernel/random/uuid)"; exit 3`))
	var pod *corev1.Pod
	maxDead := 0
	eventually(t, 180*time.Second, "restartCount >= 3 and one dead container left", func() (bool, string) {
		p, err := n.admin.CoreV1().Pods("default").Get(context.Background(), "crash", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		var restarts int32
		if len(p.Status.ContainerStatuses) == 1 {
			restarts = p.Status.ContainerStatuses[0].RestartCount
		}
		cs := n.runtimeContainers(t, p.UID)
		dead := 0
		for _, c := range cs {
			if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
				dead++
			}
		}
		// Between two rounds the kubelet may have started one more.
		assert.LessOrEqual(t, dead, 2, "dead containers of the crashing pod (restartCount %d)", restarts)
		maxDead = max(maxDead, dead)
		return restarts >= 3 && len(cs) == 1, fmt.Sprintf("restartCount=%d containers=%d", restarts, len(cs))
	})
	t.Logf("restartCount %d, at most %d dead containers seen", pod.Status.ContainerStatuses[0].RestartCount, maxDead)
	st := pod.Status.ContainerStatuses[0]
	require.NotNil(t, st.LastTerminationState.Terminated, "lastState of %+v", st)
	assert.Equal(t, int32(3), st.LastTerminationState.Terminated.ExitCode)

	// The one container left carries the restart count the status shows (or the next).
	cs := n.runtimeContainers(t, pod.UID)
	require.Len(t, cs, 1)
	ann, err := n.runtime.ContainerStatus(context.Background(), cs[0].GetId())
	require.NoError(t, err)
	rc, err := strconv.Atoi(ann.GetAnnotations()["io.kubernetes.container.restartCount"])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, rc, int(st.RestartCount))

	// --previous reads the last terminated run, whose container the GC kept.
	out, errOut, code := runKubectl(t, admin, "", 30*time.Second, "logs", "crash", "--previous")
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, regexp.MustCompile(`^run [0-9a-f-]{36}\n$`), out)

	// The restart count keeps rising with the GC removing the older runs.
	before := st.RestartCount
	n.waitPod(t, "crash", 180*time.Second, "restarted once more", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount > before
	})
	assert.LessOrEqual(t, len(n.runtimeContainers(t, pod.UID)), 2)

	// An exited ephemeral container removed from the runtime (by hand here, as a
	// garbage collector with fewer dead containers kept would) is not started again.
	sleeper := n.createPod(t, busyboxPod("sleeper", n.ctd.BusyboxImage(), corev1.RestartPolicyAlways, "exec sleep 3600"))
	n.waitPod(t, "sleeper", 90*time.Second, "Ready", podReady)
	sp, err := n.admin.CoreV1().Pods("default").Get(context.Background(), "sleeper", metav1.GetOptions{})
	require.NoError(t, err)
	sp.Spec.EphemeralContainers = append(sp.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "dbg", Image: n.ctd.BusyboxImage(), ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sh", "-c", "echo debugged"}, TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		},
	})
	_, err = n.admin.CoreV1().Pods("default").UpdateEphemeralContainers(context.Background(), "sleeper", sp, metav1.UpdateOptions{})
	require.NoError(t, err)
	n.waitPod(t, "sleeper", 60*time.Second, "dbg terminated", func(p *corev1.Pod) bool {
		for _, st := range p.Status.EphemeralContainerStatuses {
			if st.Name == "dbg" && st.State.Terminated != nil && st.ContainerID != "" {
				return true
			}
		}
		return false
	})
	dbgContainers := func() []string {
		var ids []string
		for _, c := range n.runtimeContainers(t, sleeper.UID) {
			if c.GetMetadata().GetName() == "dbg" {
				ids = append(ids, c.GetId())
			}
		}
		return ids
	}
	ids := dbgContainers()
	require.Len(t, ids, 1)
	require.NoError(t, n.runtime.RemoveContainer(context.Background(), ids[0]))
	// A negative check: the removal wakes the pod's worker at the next relist (1s),
	// and a resync follows every syncFrequency (10s); two of those go by.
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) {
		require.Empty(t, dbgContainers(), "the ephemeral container was started again after its record was removed")
		time.Sleep(time.Second)
	}

	// Image GC. Thresholds from the image file system's real usage, computed as the
	// kubelet does (100 - available*100/capacity), with the high one below it.
	fsInfo, err := n.runtime.ImageService().ImageFsInfo(context.Background(), &runtimeapi.ImageFsInfoRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, fsInfo.GetImageFilesystems())
	mount := fsInfo.GetImageFilesystems()[0].GetFsId().GetMountpoint()
	var sfs unix.Statfs_t
	require.NoError(t, unix.Statfs(mount, &sfs), "statfs of the image fs %s", mount)
	capacity, available := int64(sfs.Blocks)*sfs.Bsize, int64(sfs.Bavail)*sfs.Bsize
	usage := 100 - int(available*100/capacity)
	t.Logf("image fs %s: %d%% used (capacity %d, available %d)", mount, usage, capacity, available)
	if usage < 5 {
		t.Skipf("the image file system is only %d%% used: no high threshold below it leaves room", usage)
	}
	high, low := usage-3, usage-4

	victim := "nodekit.test/gc-victim:1"
	victimID := importFillerImage(t, n, victim)
	images := func() map[string]bool {
		list, err := n.runtime.ListImages(context.Background(), nil)
		require.NoError(t, err)
		have := map[string]bool{}
		for _, im := range list {
			for _, tag := range im.GetRepoTags() {
				have[tag] = true
			}
			have[im.GetId()] = true
		}
		return have
	}
	require.True(t, images()[victimID], "the victim image was imported")

	n.stopKubelet()
	cfgPath := filepath.Join(n.dir, "config.yaml")
	b, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	cfg := strings.Replace(string(b), "imageGCHighThresholdPercent: 100\n",
		fmt.Sprintf("imageGCHighThresholdPercent: %d\nimageGCLowThresholdPercent: %d\nimageMinimumGCAge: 1s\n", high, low), 1)
	require.NotEqual(t, string(b), cfg)
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))
	n.startKubelet(t)

	eventually(t, 90*time.Second, "the unused image removed", func() (bool, string) {
		have := images()
		return !have[victimID], fmt.Sprintf("images %v", have)
	})
	have := images()
	assert.True(t, have[n.ctd.BusyboxImage()], "the image the pod's containers use stays: %v", have)
	assert.True(t, have[n.ctd.PauseImage()], "the sandbox image stays: %v", have)
	assert.Contains(t, n.log(t), `"Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold" usage=`)

	eventually(t, 60*time.Second, "a FreeDiskSpaceFailed event on the node", func() (bool, string) {
		evs, err := n.admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + n.name + ",reason=FreeDiskSpaceFailed",
		})
		if err != nil {
			return false, err.Error()
		}
		if len(evs.Items) == 0 {
			return false, "none"
		}
		msg := evs.Items[0].Message
		assert.Regexp(t, `^Insufficient free disk space on the node's image filesystem \(\d+% of [0-9.]+ [KMGT]iB used\)\. Failed to free sufficient space by deleting unused images \(freed \d+ bytes\)\. Investigate disk usage, as it could be used by active images, logs, volumes, or other data\.$`, msg)
		assert.Equal(t, corev1.EventTypeWarning, evs.Items[0].Type)
		return true, msg
	})
	// From the second failed round in a row, ImageGCFailed with the same words.
	evs, err := n.admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + n.name + ",reason=ImageGCFailed",
	})
	require.NoError(t, err)
	require.NotEmpty(t, evs.Items)
	assert.True(t, strings.HasPrefix(evs.Items[0].Message, "Insufficient free disk space on the node's image filesystem"), evs.Items[0].Message)
}

// importFillerImage builds a one-layer OCI image holding 1 MiB of random bytes (so
// its ID is its own), imports it into the node's containerd as name and returns
// its image ID.
func importFillerImage(t *testing.T, n *testNode, name string) string {
	t.Helper()
	blob := func(b []byte) (string, []byte) {
		sum := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(sum[:]), b
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	filler := make([]byte, 1<<20)
	_, err := rand.Read(filler)
	require.NoError(t, err)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "filler", Mode: 0o644, Size: int64(len(filler)), ModTime: time.Unix(0, 0)}))
	_, err = tw.Write(filler)
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	layerDigest, layerBytes := blob(layer.Bytes())
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return b
	}
	configDigest, configBytes := blob(mustJSON(map[string]any{
		"architecture": "amd64", "os": "linux", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	}))
	manifestDigest, manifestBytes := blob(mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": len(configBytes)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": len(layerBytes)}},
	}))
	index := mustJSON(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifestDigest, "size": len(manifestBytes),
			"annotations": map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:]},
		}},
	})
	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	add := func(path string, b []byte) {
		require.NoError(t, ow.WriteHeader(&tar.Header{Name: path, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0)}))
		_, err := ow.Write(b)
		require.NoError(t, err)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", index)
	for _, bl := range []struct {
		digest string
		b      []byte
	}{{layerDigest, layerBytes}, {configDigest, configBytes}, {manifestDigest, manifestBytes}} {
		add("blobs/sha256/"+strings.TrimPrefix(bl.digest, "sha256:"), bl.b)
	}
	require.NoError(t, ow.Close())
	path := filepath.Join(t.TempDir(), "filler.tar")
	require.NoError(t, os.WriteFile(path, out.Bytes(), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmdOut, err := exec.CommandContext(ctx, "ctr", "--address", n.ctd.Address(), "--namespace", "k8s.io", "images", "import", path).CombinedOutput()
	require.NoError(t, err, "ctr images import: %s", cmdOut)
	return configDigest
}
