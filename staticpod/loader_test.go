package staticpod_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/nodekit-dev/nodekit/staticpod"
	"github.com/nodekit-dev/nodekit/staticpod/staticpodtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var seenTime = time.Date(2026, 7, 16, 9, 14, 2, 881000000, time.UTC)

// TestLoadKubeadmGolden loads four control-plane manifests laid out the way kubeadm
// writes them and compares every resulting pod, defaults included, with a golden file.
func TestLoadKubeadmGolden(t *testing.T) {
	snap, err := staticpod.Load(context.Background(), staticpod.Config{
		Dir:      "testdata/kubeadm",
		NodeName: "k8s-cp-1",
		Clock:    clocktesting.NewFakeClock(seenTime),
	})
	require.NoError(t, err)
	require.Empty(t, snap.Errors, "the kubeadm manifests must all load")
	// Sorted by file; the dotfile and the backup/ subfolder are skipped.
	assert.Equal(t, []string{
		"kube-system/etcd-k8s-cp-1",
		"kube-system/kube-apiserver-k8s-cp-1",
		"kube-system/kube-controller-manager-k8s-cp-1",
		"kube-system/kube-scheduler-k8s-cp-1",
	}, staticpodtest.Names(snap.Pods))

	for i, pod := range snap.Pods {
		base := filepath.Base(snap.Paths[i])
		t.Run(base, func(t *testing.T) {
			got, err := yaml.Marshal(pod)
			require.NoError(t, err)
			golden := filepath.Join("testdata", "golden", strings.TrimSuffix(base, filepath.Ext(base))+".yaml")
			if *update {
				require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
				require.NoError(t, os.WriteFile(golden, got, 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -run TestLoadKubeadmGolden -update to create it")
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s differs from %s (-want +got):\n%s", base, golden, diff)
			}
		})
	}
}

func mustParse(t *testing.T, path, node, manifest string) *corev1.Pod {
	t.Helper()
	pod, err := staticpod.ParseManifest(path, []byte(manifest), node)
	require.NoError(t, err)
	return pod
}

const minimal = `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: web
    image: nginx:1.27
`

func TestDefaults(t *testing.T) {
	pod := mustParse(t, "/etc/kubernetes/manifests/web.yaml", "node-a", minimal)

	assert.Equal(t, "web-node-a", pod.Name, "name gets -<node name>")
	assert.Equal(t, "default", pod.Namespace)
	assert.Equal(t, "node-a", pod.Spec.NodeName)
	assert.Equal(t, corev1.PodPending, pod.Status.Phase)
	assert.Equal(t, []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}, pod.Spec.Tolerations)
	assert.Len(t, string(pod.UID), 32, "FNV-128a in hex")
	assert.Equal(t, string(pod.UID), pod.Annotations[staticpod.AnnotationConfigHash])
	assert.Equal(t, "file", pod.Annotations[staticpod.AnnotationConfigSource])
	_, hasSeen := pod.Annotations[staticpod.AnnotationConfigSeen]
	assert.False(t, hasSeen, "config.seen is stamped by Load/Watcher, not by parsing")

	// API defaults, as the kubelet's decoder applies them.
	assert.Equal(t, corev1.RestartPolicyAlways, pod.Spec.RestartPolicy)
	assert.Equal(t, corev1.DNSClusterFirst, pod.Spec.DNSPolicy)
	assert.Equal(t, "default-scheduler", pod.Spec.SchedulerName)
	assert.Equal(t, int64(30), *pod.Spec.TerminationGracePeriodSeconds)
	assert.True(t, *pod.Spec.EnableServiceLinks)
	c := pod.Spec.Containers[0]
	assert.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy)
	assert.Equal(t, "/dev/termination-log", c.TerminationMessagePath)
	assert.Equal(t, corev1.TerminationMessageReadFile, c.TerminationMessagePolicy)
}

// The kubelet lowercases the node name in the pod name, but validates spec.nodeName
// as a DNS-1123 subdomain, so a node name with capitals loads no static pod at all
// (measured against the kubelet's own file source in upstream/staticpod).
func TestUpperCaseNodeName(t *testing.T) {
	_, err := staticpod.ParseManifest("/m/web.yaml", []byte(minimal), "Node-A")
	require.ErrorIs(t, err, staticpod.ErrInvalidPod)
	assert.Contains(t, err.Error(), `spec.nodeName: Invalid value: "Node-A": a lowercase RFC 1123 subdomain`)
}

func TestImagePullPolicyDefault(t *testing.T) {
	for image, want := range map[string]corev1.PullPolicy{
		"nginx":                    corev1.PullAlways,
		"nginx:latest":             corev1.PullAlways,
		"nginx:1.27":               corev1.PullIfNotPresent,
		"localhost:5000/nginx":     corev1.PullAlways,
		"localhost:5000/nginx:1.2": corev1.PullIfNotPresent,
		"nginx@sha256:" + strings.Repeat("a", 64): corev1.PullIfNotPresent,
	} {
		t.Run(image, func(t *testing.T) {
			m := strings.Replace(minimal, "nginx:1.27", image, 1)
			pod := mustParse(t, "/m/web.yaml", "n", m)
			assert.Equal(t, want, pod.Spec.Containers[0].ImagePullPolicy)
		})
	}
}

func TestTolerationMerge(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  []corev1.Toleration
	}{
		{
			name:  "same toleration is not duplicated",
			extra: "  tolerations:\n  - operator: Exists\n    effect: NoExecute\n",
			want:  []corev1.Toleration{{Operator: "Exists", Effect: "NoExecute"}},
		},
		{
			name:  "matching toleration with tolerationSeconds is replaced",
			extra: "  tolerations:\n  - operator: Exists\n    effect: NoExecute\n    tolerationSeconds: 60\n",
			want:  []corev1.Toleration{{Operator: "Exists", Effect: "NoExecute"}},
		},
		{
			name:  "other tolerations are kept and ours appended",
			extra: "  tolerations:\n  - key: node-role.kubernetes.io/control-plane\n    operator: Exists\n    effect: NoSchedule\n",
			want: []corev1.Toleration{
				{Key: "node-role.kubernetes.io/control-plane", Operator: "Exists", Effect: "NoSchedule"},
				{Operator: "Exists", Effect: "NoExecute"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := mustParse(t, "/m/web.yaml", "n", minimal+tt.extra)
			assert.Equal(t, tt.want, pod.Spec.Tolerations)
		})
	}
}

func TestUIDRules(t *testing.T) {
	base := mustParse(t, "/m/web.yaml", "node-a", minimal)

	t.Run("deterministic", func(t *testing.T) {
		again := mustParse(t, "/m/web.yaml", "node-a", minimal)
		assert.Equal(t, base.UID, again.UID)
	})
	t.Run("depends on node", func(t *testing.T) {
		assert.NotEqual(t, base.UID, mustParse(t, "/m/web.yaml", "node-b", minimal).UID)
	})
	t.Run("depends on path", func(t *testing.T) {
		assert.NotEqual(t, base.UID, mustParse(t, "/m/web2.yaml", "node-a", minimal).UID)
	})
	t.Run("depends on content", func(t *testing.T) {
		changed := strings.Replace(minimal, "nginx:1.27", "nginx:1.28", 1)
		assert.NotEqual(t, base.UID, mustParse(t, "/m/web.yaml", "node-a", changed).UID)
	})
	t.Run("explicit defaults hash like omitted ones", func(t *testing.T) {
		explicit := minimal + "    imagePullPolicy: IfNotPresent\n    terminationMessagePath: /dev/termination-log\n  restartPolicy: Always\n  dnsPolicy: ClusterFirst\n"
		assert.Equal(t, base.UID, mustParse(t, "/m/web.yaml", "node-a", explicit).UID)
	})
	t.Run("JSON and YAML of the same pod hash alike", func(t *testing.T) {
		js := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"web","image":"nginx:1.27"}]}}`
		assert.Equal(t, base.UID, mustParse(t, "/m/web.yaml", "node-a", js).UID)
	})
	t.Run("a manifest's own uid is kept", func(t *testing.T) {
		pinned := strings.Replace(minimal, "  name: web\n", "  name: web\n  uid: 1234-pinned\n", 1)
		pod := mustParse(t, "/m/web.yaml", "node-a", pinned)
		assert.Equal(t, "1234-pinned", string(pod.UID))
		assert.Equal(t, "1234-pinned", pod.Annotations[staticpod.AnnotationConfigHash])
	})
	t.Run("ManifestUID matches ParseManifest", func(t *testing.T) {
		raw, err := staticpod.Decode("/m/web.yaml", []byte(minimal))
		require.NoError(t, err)
		staticpod.ApplyDefaults(raw, "node-a", "/m/web.yaml")
		assert.Equal(t, base.UID, raw.UID)
	})
}

func TestConfigSeenKeptAcrossLoads(t *testing.T) {
	dir := t.TempDir()
	staticpodtest.WriteManifest(t, dir, "web.yaml", []byte(minimal))
	clk := clocktesting.NewFakeClock(seenTime)
	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n", Clock: clk})
	require.NoError(t, err)
	require.Len(t, snap.Pods, 1)
	assert.Equal(t, "2026-07-16T09:14:02.881000000Z", snap.Pods[0].Annotations[staticpod.AnnotationConfigSeen])
}

func TestLoadMissingFolderIsEmpty(t *testing.T) {
	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: filepath.Join(t.TempDir(), "nope"), NodeName: "n"})
	require.NoError(t, err)
	assert.Empty(t, snap.Pods)
	assert.Empty(t, snap.Errors)
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]staticpod.Config{
		"no dir":          {NodeName: "n"},
		"no node":         {Dir: "/x"},
		"negative rescan": {Dir: "/x", NodeName: "n", RescanPeriod: -time.Second},
		"bad policy":      {Dir: "/x", NodeName: "n", OnBroken: 7},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := staticpod.New(cfg)
			require.ErrorIs(t, err, staticpod.ErrInvalidConfig)
			_, err = staticpod.Load(context.Background(), cfg)
			require.ErrorIs(t, err, staticpod.ErrInvalidConfig)
		})
	}
}
