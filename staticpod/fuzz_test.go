package staticpod_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/staticpod"
)

// FuzzParseManifest feeds arbitrary bytes through the whole per-file pipeline. Seeds
// live in testdata/fuzz/FuzzParseManifest (the kubeadm manifests and broken
// variants); run with: go test -run '^$' -fuzz FuzzParseManifest ./staticpod/
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(minimal))
	f.Fuzz(func(t *testing.T, data []byte) {
		pod, err := staticpod.ParseManifest("/etc/kubernetes/manifests/f.yaml", data, "node-a")
		if err != nil {
			var me *staticpod.ManifestError
			if !errors.As(err, &me) || !errors.Is(err, staticpod.ErrInvalidManifest) {
				t.Fatalf("error is not a *ManifestError matching ErrInvalidManifest: %T %v", err, err)
			}
			if !strings.HasPrefix(err.Error(), "/etc/kubernetes/manifests/f.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if !strings.HasSuffix(pod.Name, "-node-a") {
			t.Fatalf("name %q lacks the node suffix", pod.Name)
		}
		if pod.Namespace == "" || pod.Spec.NodeName != "node-a" || pod.Status.Phase != corev1.PodPending {
			t.Fatalf("defaults missing: ns=%q node=%q phase=%q", pod.Namespace, pod.Spec.NodeName, pod.Status.Phase)
		}
		if string(pod.UID) != pod.Annotations[staticpod.AnnotationConfigHash] || pod.UID == "" {
			t.Fatalf("uid %q and config.hash %q differ", pod.UID, pod.Annotations[staticpod.AnnotationConfigHash])
		}
		if err := staticpod.Validate(pod); err != nil {
			t.Fatalf("a loaded pod fails validation: %v", err)
		}
		again, err := staticpod.ParseManifest("/etc/kubernetes/manifests/f.yaml", data, "node-a")
		if err != nil || again.UID != pod.UID {
			t.Fatalf("not deterministic: %v, %q vs %q", err, again.UID, pod.UID)
		}
	})
}
