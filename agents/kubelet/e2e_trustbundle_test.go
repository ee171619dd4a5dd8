package main_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestKubeletClusterTrustBundles projects ClusterTrustBundles into a pod on a
// real node, with the node's own credentials (the Node authorizer's rules must
// let it list and watch them): by name and by signer and labels, merged without
// duplicates, updated on a later sync when a bundle of the signer appears, and a
// pod whose non-optional source matches nothing never starts and gets the
// FailedMount event.
func TestKubeletClusterTrustBundles(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-node-ctb", true)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	ctx := context.Background()
	ctbs := n.admin.CertificatesV1().ClusterTrustBundles()
	create := func(name, signer, bundle string, labels map[string]string) {
		t.Helper()
		_, err := ctbs.Create(ctx, &certificatesv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: bundle},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	plain, alive1, alive2, dead, later := testCA(t, "plain"), testCA(t, "alive1"), testCA(t, "alive2"), testCA(t, "dead"), testCA(t, "later")
	create("plain-roots", "", plain, nil)
	create("example.com:roots:a", "example.com/roots", alive1, map[string]string{"alive": "true"})
	create("example.com:roots:b", "example.com/roots", alive2+alive1, map[string]string{"alive": "true"})
	create("example.com:roots:c", "example.com/roots", dead, map[string]string{"alive": "false"})

	projected := func(sources ...corev1.ClusterTrustBundleProjection) []corev1.Volume {
		v := corev1.Volume{Name: "roots", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr[int32](0o644)}}}
		for i := range sources {
			v.Projected.Sources = append(v.Projected.Sources, corev1.VolumeProjection{ClusterTrustBundle: &sources[i]})
		}
		return []corev1.Volume{v}
	}

	p := busyboxPod("ctb", n.ctd.BusyboxImage(), corev1.RestartPolicyNever, "sleep 3600")
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "roots", MountPath: "/roots"}}
	p.Spec.Volumes = projected(
		corev1.ClusterTrustBundleProjection{Name: ptr("plain-roots"), Path: "plain.pem"},
		corev1.ClusterTrustBundleProjection{SignerName: ptr("example.com/roots"), Path: "alive.pem",
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"alive": "true"}}},
		corev1.ClusterTrustBundleProjection{Name: ptr("no-such-bundle"), Optional: ptr(true), Path: "none.pem"},
	)
	n.createPod(t, p)
	pod := n.waitPod(t, "ctb", 60*time.Second, "ready", podReady)
	cat := func(file string) string {
		out, code := n.exec(t, pod, "cat", "/roots/"+file)
		require.Zero(t, code, "cat %s: %s", file, out)
		return out
	}
	assert.Equal(t, certSet(t, plain), certSet(t, cat("plain.pem")))
	assert.Equal(t, certSet(t, alive1, alive2), certSet(t, cat("alive.pem")), "both bundles, alive1 once, dead left out")
	assert.Equal(t, 2, strings.Count(cat("alive.pem"), "-----BEGIN CERTIFICATE-----"))
	assert.Empty(t, cat("none.pem"))
	out, _ := n.exec(t, pod, "stat", "-L", "-c", "%a", "/roots/alive.pem")
	assert.Equal(t, "644\n", out)

	// A new bundle of the signer reaches the file on a later sync (syncFrequency 10s).
	create("example.com:roots:d", "example.com/roots", later, map[string]string{"alive": "true"})
	eventually(t, 40*time.Second, "the new bundle in alive.pem", func() (bool, string) {
		got := cat("alive.pem")
		return assert.ObjectsAreEqual(certSet(t, alive1, alive2, later), certSet(t, got)), got
	})

	const message = `MountVolume.SetUp failed for volume "roots" : combination of signerName and labelSelector matched zero ClusterTrustBundles`
	bad := busyboxPod("ctb-missing", n.ctd.BusyboxImage(), corev1.RestartPolicyNever, "sleep 3600")
	bad.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "roots", MountPath: "/roots"}}
	bad.Spec.Volumes = projected(corev1.ClusterTrustBundleProjection{SignerName: ptr("example.com/roots"), Optional: ptr(false), Path: "x.pem",
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"alive": "unknown"}}})
	n.createPod(t, bad)
	eventually(t, 30*time.Second, "the FailedMount event", func() (bool, string) {
		return hasEvent(n.events(t, "ctb-missing"), "FailedMount", message), ""
	})
	got := n.waitPod(t, "ctb-missing", 10*time.Second, "not ready", func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionFalse && c.Reason == "ContainersNotReady" && c.Message == "containers with unready status: [main]"
			}
		}
		return false
	})
	assert.Equal(t, corev1.PodPending, got.Status.Phase)
	assert.Empty(t, n.runtimeContainers(t, got.UID), "no container starts")
}

func testCA(t *testing.T, cn string) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// certSet is the sorted, distinct DER certificates of the PEM texts: the
// kubelet writes them in random order.
func certSet(t *testing.T, pems ...string) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, p := range pems {
		rest := []byte(p)
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			require.Equal(t, "CERTIFICATE", b.Type)
			seen[string(b.Bytes)] = true
		}
	}
	out := []string{}
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}
