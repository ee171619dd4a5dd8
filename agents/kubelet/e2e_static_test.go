package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

const staticManifest = `apiVersion: v1
kind: Pod
metadata:
  name: static-web
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "sleep 3600"]
`

// The seed's bootstrap in miniature: a kubelet with no API server runs a static pod
// from its manifest folder; restarted with a kubeconfig, it registers the node and
// posts the mirror pod, and the static pod's container is left running untouched.
func TestKubeletStaticPods(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-static", true)
	// Start over standalone: no --kubeconfig.
	n.stopKubelet()
	withKubeconfig := append([]string(nil), n.args...)
	n.args = slices.DeleteFunc(n.args, func(a string) bool { return len(a) > 13 && a[:13] == "--kubeconfig=" })
	// Standalone, the kubelet API cannot ask the API server (TokenReview,
	// SubjectAccessReview): as upstream, the kubelet refuses to start with its default
	// webhooks, so this config turns them off (client certificates of the cluster CA
	// are still what it trusts).
	conf, err := os.ReadFile(filepath.Join(n.dir, "config.yaml"))
	require.NoError(t, err)
	standalone := filepath.Join(n.dir, "config-standalone.yaml")
	require.Contains(t, string(conf), "authentication:\n  x509:\n    clientCAFile: ")
	conf = []byte(strings.Replace(string(conf), "authentication:\n", "authentication:\n  webhook: {enabled: false}\n", 1) +
		"authorization: {mode: AlwaysAllow}\n")
	require.NoError(t, os.WriteFile(standalone, conf, 0o600))
	for i, a := range n.args {
		if strings.HasPrefix(a, "--config=") {
			n.args[i] = "--config=" + standalone
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(n.dir, "manifests", "web.yaml"), []byte(fmt.Sprintf(staticManifest, n.ctd.BusyboxImage())), 0o644))
	n.startKubelet(t)

	var containerID string
	eventually(t, 60*time.Second, "the static pod's container running with no API server", func() (bool, string) {
		cs, err := n.runtime.ListContainers(context.Background(), &runtimeapi.ContainerFilter{
			LabelSelector: map[string]string{cri.LabelPodName: "static-web-nk-static"},
		})
		if err != nil || len(cs) == 0 {
			return false, fmt.Sprint(err)
		}
		containerID = cs[0].GetId()
		return cs[0].GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING, cs[0].GetState().String()
	})
	assert.Contains(t, n.log(t), "No API server defined - no node status update will be sent")

	n.stopKubelet()
	n.args = withKubeconfig
	n.startKubelet(t)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	var mirror *corev1.Pod
	eventually(t, 60*time.Second, "the mirror pod Running in the API", func() (bool, string) {
		p, err := n.admin.CoreV1().Pods("default").Get(context.Background(), "static-web-nk-static", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		mirror = p
		return p.Status.Phase == corev1.PodRunning && podReady(p), fmt.Sprintf("%s %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	assert.NotEmpty(t, mirror.Annotations["kubernetes.io/config.mirror"])
	assert.Equal(t, "file", mirror.Annotations["kubernetes.io/config.source"])
	require.Len(t, mirror.OwnerReferences, 1)
	assert.Equal(t, "Node", mirror.OwnerReferences[0].Kind)
	require.Len(t, mirror.Status.ContainerStatuses, 1)
	assert.Equal(t, "containerd://"+containerID, mirror.Status.ContainerStatuses[0].ContainerID, "the same container, not restarted")
	assert.Equal(t, int32(0), mirror.Status.ContainerStatuses[0].RestartCount)
	out := kubectl(t, cp, "get", "pod", "static-web-nk-static", "--no-headers")
	assert.Regexp(t, `^static-web-nk-static\s+1/1\s+Running\s+0\s`, out)

	// Removing the manifest stops the pod and removes the mirror.
	require.NoError(t, os.Remove(filepath.Join(n.dir, "manifests", "web.yaml")))
	eventually(t, 60*time.Second, "the static pod's containers gone", func() (bool, string) {
		cs, err := n.runtime.ListContainers(context.Background(), &runtimeapi.ContainerFilter{
			LabelSelector: map[string]string{cri.LabelPodName: "static-web-nk-static"},
		})
		return err == nil && len(cs) == 0, fmt.Sprintf("%d containers, %v", len(cs), err)
	})
	eventually(t, 30*time.Second, "the mirror pod deleted", func() (bool, string) {
		_, err := n.admin.CoreV1().Pods("default").Get(context.Background(), "static-web-nk-static", metav1.GetOptions{})
		return err != nil, fmt.Sprint(err)
	})
}
