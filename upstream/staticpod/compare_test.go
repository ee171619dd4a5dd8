// Package staticpod_test compares nodekit's static pod loader with the kubelet's own
// file source (k8s.io/kubernetes/pkg/kubelet/config, v1.37.2) on the same manifests.
package staticpod_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"

	"github.com/nodekit-dev/nodekit/staticpod"
)

const nodeName = "k8s-cp-1"

// kubeletLoad runs the kubelet's real file source on dir and returns the pods of its
// first update, by name.
func kubeletLoad(t *testing.T, dir string, want int) map[string]*v1.Pod {
	t.Helper()
	cfg := config.NewPodConfig(record.NewFakeRecorder(100), nil)
	// The source's goroutines run for the life of the test binary: upstream has no
	// way to stop them.
	config.NewSourceFile(klog.Background(), dir, types.NodeName(nodeName), time.Hour, cfg.Channel(context.Background(), kubetypes.FileSource))
	out := map[string]*v1.Pod{}
	deadline := time.After(30 * time.Second)
	for len(out) < want {
		select {
		case u := <-cfg.Updates():
			for _, p := range u.Pods {
				out[p.Name] = p
			}
		case <-deadline:
			t.Fatalf("kubelet file source gave %d pods, want %d", len(out), want)
		}
	}
	return out
}

// TestCompareWithKubelet loads the kubeadm manifests from ../../staticpod/testdata
// with both loaders. Expected and documented: the UIDs (and so config.hash) differ,
// because the kubelet hashes a dump of its internal Pod type. Asserted: everything
// else about the pods is identical, so nodekit's defaulting matches the kubelet's.
func TestCompareWithKubelet(t *testing.T) {
	src := filepath.Join("..", "..", "staticpod", "testdata", "kubeadm")
	dir := t.TempDir() // an absolute path, as a kubelet is configured
	entries, err := os.ReadDir(src)
	must(t, err)
	n := 0
	for _, e := range entries {
		if e.IsDir() || e.Name()[0] == '.' {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644))
		n++
	}

	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: nodeName})
	must(t, err)
	if len(snap.Errors) != 0 || len(snap.Pods) != n {
		t.Fatalf("nodekit loaded %d pods with errors %v, want %d", len(snap.Pods), snap.Errors, n)
	}
	theirs := kubeletLoad(t, dir, n)

	sameUID := 0
	for _, ours := range snap.Pods {
		kp, ok := theirs[ours.Name]
		if !ok {
			t.Fatalf("kubelet has no pod %s", ours.Name)
		}
		t.Logf("%-40s nodekit uid %s  kubelet uid %s", ours.Name, ours.UID, kp.UID)
		if ours.UID == kp.UID {
			sameUID++
		}
		a, b := normalize(ours), normalize(kp)
		if diff := cmp.Diff(b, a); diff != "" {
			t.Errorf("%s: pods differ beyond UID/hash/seen (-kubelet +nodekit):\n%s", ours.Name, diff)
		}
	}
	t.Logf("UIDs equal for %d of %d pods", sameUID, n)
}

// normalize drops what is expected to differ: the UID and its copy in config.hash,
// and config.seen (a timestamp). The kubelet adds config.source when it merges
// sources, after the file source; nodekit sets it at load time, so it is dropped too.
func normalize(p *v1.Pod) *v1.Pod {
	c := p.DeepCopy()
	c.UID = ""
	for _, k := range []string{staticpod.AnnotationConfigHash, staticpod.AnnotationConfigSeen, staticpod.AnnotationConfigSource} {
		delete(c.Annotations, k)
	}
	return c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestKubeletLeniency records, against the real kubelet code, the two cases where
// nodekit is deliberately stricter: the kubelet runs a manifest with an unknown field
// (dropping the field) and runs only the first of several YAML documents.
func TestKubeletLeniency(t *testing.T) {
	const pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: NAME\nspec:\n  containers:\n  - name: c\n    image: nginx:1.27\n"
	for name, manifest := range map[string]string{
		"unknown-field": strings.Replace(pod, "NAME", "unknown-field", 1) + "    imagePullPolicyy: Always\n",
		"two-documents": strings.Replace(pod, "NAME", "two-documents", 1) + "---\n" + strings.Replace(pod, "NAME", "second", 1),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(manifest), 0o644))
			theirs := kubeletLoad(t, dir, 1)
			if _, ok := theirs[name+"-"+nodeName]; !ok || len(theirs) != 1 {
				t.Fatalf("kubelet loaded %v", theirs)
			}
			snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: nodeName})
			must(t, err)
			if len(snap.Pods) != 0 || len(snap.Errors) != 1 {
				t.Fatalf("nodekit loaded %d pods, %d errors", len(snap.Pods), len(snap.Errors))
			}
			t.Logf("kubelet runs %s; nodekit refuses it: %v", name, snap.Errors[0])
		})
	}
}
