package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
)

// renameImage copies the OCI layout tar at src with its one image renamed to name (the
// io.containerd.image.name annotation `ctr images import` reads): the same manifest,
// so the same digest, under a name no registry outside serves. It returns the copy and
// the manifest digest.
func renameImage(t *testing.T, src, name string) (string, string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	dst := filepath.Join(t.TempDir(), "renamed.tar")
	out, err := os.Create(dst)
	require.NoError(t, err)
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	digest := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		if h.Name == "index.json" {
			var index struct {
				SchemaVersion int              `json:"schemaVersion"`
				Manifests     []map[string]any `json:"manifests"`
			}
			require.NoError(t, json.Unmarshal(b, &index))
			require.Len(t, index.Manifests, 1, "%s: one image", src)
			index.Manifests[0]["annotations"] = map[string]string{"io.containerd.image.name": name}
			digest = index.Manifests[0]["digest"].(string)
			b, err = json.Marshal(index)
			require.NoError(t, err)
			h.Size = int64(len(b))
		}
		require.NoError(t, tw.WriteHeader(h))
		_, err = tw.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NotEmpty(t, digest, "%s has no index.json", src)
	return dst, digest
}

// variantImage copies the OCI layout tar at src into a distinct image named name: the
// same layers plus one new gzip layer (a file /variant), a config with a label and that
// layer's diff ID (so another image ID), and a manifest pointing at them. It returns the
// copy, the new manifest digest, the new config digest and the new layer's digest.
func variantImage(t *testing.T, src, name string) (string, string, string, string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	files := map[string][]byte{}
	var order []*tar.Header
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[h.Name] = b
		order = append(order, h)
	}
	sum := func(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }
	var index map[string]any
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	desc := index["manifests"].([]any)[0].(map[string]any)
	var manifest map[string]any
	require.NoError(t, json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(desc["digest"].(string), "sha256:")], &manifest))
	cfgDesc := manifest["config"].(map[string]any)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(cfgDesc["digest"].(string), "sha256:")], &cfg))
	inner, _ := cfg["config"].(map[string]any)
	if inner == nil {
		inner = map[string]any{}
		cfg["config"] = inner
	}
	inner["Labels"] = map[string]string{"test.nodekit.dev/variant": name}
	var layerTar bytes.Buffer
	ltw := tar.NewWriter(&layerTar)
	require.NoError(t, ltw.WriteHeader(&tar.Header{Name: "variant", Mode: 0o644, Size: int64(len(name)), Typeflag: tar.TypeReg}))
	_, err = ltw.Write([]byte(name))
	require.NoError(t, err)
	require.NoError(t, ltw.Close())
	var layerGz bytes.Buffer
	gz := gzip.NewWriter(&layerGz)
	_, err = gz.Write(layerTar.Bytes())
	require.NoError(t, err)
	require.NoError(t, gz.Close())
	layer := layerGz.Bytes()
	rootfs := cfg["rootfs"].(map[string]any)
	rootfs["diff_ids"] = append(rootfs["diff_ids"].([]any), "sha256:"+sum(layerTar.Bytes()))
	manifest["layers"] = append(manifest["layers"].([]any), map[string]any{
		"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + sum(layer), "size": len(layer)})
	cfgBytes, err := json.Marshal(cfg)
	require.NoError(t, err)
	cfgDesc["digest"], cfgDesc["size"] = "sha256:"+sum(cfgBytes), len(cfgBytes)
	manBytes, err := json.Marshal(manifest)
	require.NoError(t, err)
	desc["digest"], desc["size"] = "sha256:"+sum(manBytes), len(manBytes)
	desc["annotations"] = map[string]string{"io.containerd.image.name": name}
	idxBytes, err := json.Marshal(index)
	require.NoError(t, err)
	files["index.json"] = idxBytes

	dst := filepath.Join(t.TempDir(), "variant.tar")
	out, err := os.Create(dst)
	require.NoError(t, err)
	defer out.Close()
	tw := tar.NewWriter(out)
	write := func(h *tar.Header, b []byte) {
		h.Size = int64(len(b))
		require.NoError(t, tw.WriteHeader(h))
		_, err := tw.Write(b)
		require.NoError(t, err)
	}
	for _, h := range order {
		write(h, files[h.Name])
	}
	write(&tar.Header{Name: "blobs/sha256/" + sum(cfgBytes), Mode: 0o644, Typeflag: tar.TypeReg}, cfgBytes)
	write(&tar.Header{Name: "blobs/sha256/" + sum(manBytes), Mode: 0o644, Typeflag: tar.TypeReg}, manBytes)
	write(&tar.Header{Name: "blobs/sha256/" + sum(layer), Mode: 0o644, Typeflag: tar.TypeReg}, layer)
	require.NoError(t, tw.Close())
	return dst, "sha256:" + sum(manBytes), "sha256:" + sum(cfgBytes), "sha256:" + sum(layer)
}

// hostDeprecations are the containerd deprecation warnings this machine causes whatever
// the configuration says: cgroup v1 (containerd 2.2 and later warn about it), as a
// containerd 2 installed on the machine itself would report.
func hostDeprecations() map[string]bool {
	dep := map[string]bool{}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
		dep["io.containerd.deprecation/cgroup-v1"] = true
	}
	return dep
}

// assertContainerdConfigCurrent: the node's containerd read its configuration as
// written (no "Configuration migrated from version N" at start: up writes the
// layout of the containerd it runs), and neither `ctr deprecations list` nor the CRI
// runtime condition ContainerdHasNoDeprecationWarnings reports anything the machine
// itself does not cause.
func assertContainerdConfigCurrent(t *testing.T, st *cluster.State, stateDir, crictl string, n cluster.Node) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(stateDir, "logs", n.Name+"-containerd.log"))
	require.NoError(t, err)
	var migrated []string
	for line := range strings.Lines(string(log)) {
		if strings.Contains(line, "Configuration migrated from version") {
			migrated = append(migrated, strings.TrimSpace(line))
		}
	}
	assert.Empty(t, migrated, "node %s: containerd migrated the configuration up wrote", n.Name)
	if st.ContainerdDir == "" {
		return // the machine's containerd 1.6: no deprecations service
	}
	host := hostDeprecations()
	ctr := filepath.Join(st.ContainerdDir, "ctr")
	out, err := exec.Command(ctr, "--address", strings.TrimPrefix(n.Runtime, "unix://"), "deprecations", "list", "--format", "json").CombinedOutput()
	require.NoError(t, err, "ctr deprecations list: %s", out)
	var warnings []struct {
		ID      string `json:"id"`
		Message string `json:"message"`
	}
	require.NoError(t, json.Unmarshal(out, &warnings), "%s", out)
	for _, w := range warnings {
		assert.True(t, host[w.ID], "node %s: containerd deprecation %s: %s", n.Name, w.ID, w.Message)
	}

	info, err := exec.Command("nsenter", "--net=/var/run/netns/"+n.NetNS, crictl, "--config", filepath.Join(n.Dir, "crictl.yaml"), "info").Output()
	require.NoError(t, err, "crictl info")
	var status struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	require.NoError(t, json.Unmarshal(info, &status), "%s", info)
	for _, c := range status.Status.Conditions {
		if c.Type != "ContainerdHasNoDeprecationWarnings" || c.Status {
			continue
		}
		// The message is a JSON object of the deprecation IDs and their texts.
		var ids map[string]string
		require.NoError(t, json.Unmarshal([]byte(c.Message), &ids), "%s", c.Message)
		for id := range ids {
			assert.True(t, host[id], "node %s: CRI condition ContainerdHasNoDeprecationWarnings=false for %s", n.Name, id)
		}
	}
}

// TestUpRegistryMirror: on a two-node cluster, pods with imagePullPolicy: Always reach
// Running on every node through the mirror, for an image up imported and for one
// `nodekit load` added afterwards under a registry.k8s.io name; the pulled image keeps
// the loaded digest and nothing is downloaded again; a tag nobody loaded fails at once
// with the registry's "not found" (ErrImagePull), not a timeout. An image removed from
// one node's containerd is downloaded from the mirror again, with the same image ID.
// Each node's containerd read the configuration up wrote as it is, with no deprecation
// warning the machine does not cause (assertContainerdConfigCurrent).
func TestUpRegistryMirror(t *testing.T) {
	peers, images, crictl := upEnv(t)
	kubelet := agentBinary(t, "kubelet")
	kubeProxy := agentBinary(t, "kube-proxy")
	name := "m" + strconv.Itoa(os.Getpid()%100000)
	stateDir := filepath.Join(t.TempDir(), "state")
	env := []string{"NODEKIT_PEERS_DIR=" + peers, "NODEKIT_IMAGES_DIR=" + images}
	out, stderr, code := nodekit(t, env, "up", "--detach", "--name", name, "--state-dir", stateDir, "--api-port", strconv.Itoa(freePort(t)),
		"--nodes", "2", "--kubelet-binary", kubelet, "--kube-proxy-binary", kubeProxy, "--coredns-image-tar=")
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(stateDir, cluster.StateFile)); err == nil {
			_, e, _ := nodekit(t, nil, "down", "--state-dir", stateDir)
			t.Logf("cleanup down: %s", e)
		}
	})
	require.Equal(t, 0, code, "up: %s\n%s", out, stderr)
	st, err := cluster.LoadState(stateDir)
	require.NoError(t, err)
	assert.Equal(t, "172.30.0.1:5000", st.Mirror)

	const loadedName = "registry.k8s.io/nodekit-test/mirror:loaded"
	renamed, digest := renameImage(t, filepath.Join(images, "busybox.tar"), loadedName)
	_, lerr, code := nodekit(t, nil, "load", "--state-dir", stateDir, renamed)
	require.Equal(t, 0, code, lerr)

	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(stateDir, "kubeconfig"))
	require.NoError(t, err)
	client := kubernetes.NewForConfigOrDie(rc)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pod := func(podName, image, node string) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName},
			Spec: corev1.PodSpec{
				NodeName:                      node,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: corev1.PullAlways,
					Command: []string{"sleep", "3600"}}},
			},
		}
		_, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// ServiceAccount admission needs the default ServiceAccount, which up waits for.
	for _, n := range st.Nodes {
		pod("up-"+n.Name, busyboxImage(t, images), n.Name)
		pod("loaded-"+n.Name, loadedName, n.Name)
	}
	pod("absent", "registry.k8s.io/nodekit-test/mirror:absent", st.Nodes[1].Name)

	for _, n := range st.Nodes {
		for _, podName := range []string{"up-" + n.Name, "loaded-" + n.Name} {
			waitRunning(ctx, t, client, podName)
		}
		p, err := client.CoreV1().Pods("default").Get(ctx, "loaded-"+n.Name, metav1.GetOptions{})
		require.NoError(t, err)
		require.Len(t, p.Status.ContainerStatuses, 1)
		// The repository in imageID is the first of the image's repo digests: the
		// renamed copy shares its image ID with up's busybox, so either name may come
		// first; the digest is what must be the loaded one.
		assert.True(t, strings.HasSuffix(p.Status.ContainerStatuses[0].ImageID, "@"+digest),
			"node %s: the pulled image is the loaded manifest %s, imageID %s", n.Name, digest, p.Status.ContainerStatuses[0].ImageID)
	}

	var waiting *corev1.ContainerStateWaiting
	require.Eventually(t, func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, "absent", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		waiting = p.Status.ContainerStatuses[0].State.Waiting
		return waiting != nil && (waiting.Reason == "ErrImagePull" || waiting.Reason == "ImagePullBackOff")
	}, time.Minute, 100*time.Millisecond, "pod absent: ErrImagePull or ImagePullBackOff")
	if waiting.Reason == "ErrImagePull" {
		assert.Contains(t, waiting.Message, "not found")
	}
	events, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=absent,reason=Failed"})
	require.NoError(t, err)
	var messages []string
	for _, e := range events.Items {
		messages = append(messages, e.Message)
	}
	assert.Contains(t, strings.Join(messages, "\n"), "registry.k8s.io/nodekit-test/mirror:absent: not found",
		"the mirror's 404, not a registry that cannot be reached")

	// Every image was in the nodes' content stores already: the mirror answered
	// manifest requests only, no blob.
	mirrorLog, err := os.ReadFile(filepath.Join(stateDir, "logs", "supervisor.log"))
	require.NoError(t, err)
	assert.Contains(t, string(mirrorLog), "HEAD /v2/"+strings.TrimSuffix(loadedName, ":loaded")+"/manifests/loaded")
	assert.NotContains(t, string(mirrorLog), "/blobs/sha256:", "nothing may be downloaded again")

	// Gone from node-1's containerd (as image garbage collection would do): the pull
	// downloads the manifest, the config and the new layer from the mirror (the other
	// layers are busybox's, still there), containerd checks every digest and unpacks
	// the layer, and the image gets the loaded ID again.
	const variantName = "registry.k8s.io/nodekit-test/variant:1"
	variant, variantDigest, variantID, variantLayer := variantImage(t, filepath.Join(images, "busybox.tar"), variantName)
	_, lerr, code = nodekit(t, nil, "load", "--state-dir", stateDir, variant)
	require.Equal(t, 0, code, lerr)
	n1 := st.Nodes[0]
	crictlOn := func(args ...string) string {
		b, err := exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + n1.NetNS, crictl, "--config", filepath.Join(n1.Dir, "crictl.yaml")}, args...)...).CombinedOutput()
		require.NoError(t, err, "crictl %v: %s", args, b)
		return strings.TrimSpace(string(b))
	}
	assert.Equal(t, variantID, crictlOn("inspecti", "-o", "go-template", "--template", "{{.status.id}}", variantName))
	crictlOn("rmi", variantName)
	pod("variant", variantName, n1.Name)
	waitRunning(ctx, t, client, "variant")
	assert.Equal(t, variantID, crictlOn("inspecti", "-o", "go-template", "--template", "{{.status.id}}", variantName),
		"the image ID after the download is the loaded one")
	p, err := client.CoreV1().Pods("default").Get(ctx, "variant", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "registry.k8s.io/nodekit-test/variant@"+variantDigest, p.Status.ContainerStatuses[0].ImageID)
	mirrorLog, err = os.ReadFile(filepath.Join(stateDir, "logs", "supervisor.log"))
	require.NoError(t, err)
	assert.Contains(t, string(mirrorLog), "GET /v2/registry.k8s.io/nodekit-test/variant/manifests/"+variantDigest)
	assert.Contains(t, string(mirrorLog), "GET /v2/registry.k8s.io/nodekit-test/variant/blobs/"+variantID)
	assert.Contains(t, string(mirrorLog), "GET /v2/registry.k8s.io/nodekit-test/variant/blobs/"+variantLayer)
	b, err := exec.Command(filepath.Join(peers, "kubectl"), "--kubeconfig", filepath.Join(stateDir, "kubeconfig"), "exec", "variant", "--", "cat", "/variant").CombinedOutput()
	require.NoError(t, err, "%s", b)
	assert.Equal(t, variantName, string(b), "the downloaded layer is in the container's root")
	t.Logf("mirror log:\n%s", mirrorLog)
	for _, n := range st.Nodes {
		assertContainerdConfigCurrent(t, st, stateDir, crictl, n)
	}

	_, stderr, code = nodekit(t, nil, "down", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	_, err = os.Stat(stateDir)
	assert.True(t, os.IsNotExist(err), fmt.Sprintf("down removes the state dir with the mirror's list: %v", err))
}
