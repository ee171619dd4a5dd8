package volume_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

// caPEM makes a self-signed CA certificate as one PEM block.
func caPEM(t *testing.T, cn string) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func ctb(name, signer, bundle string, labels map[string]string) *certificatesv1.ClusterTrustBundle {
	return &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: bundle},
	}
}

// sortedPEM is what the kubelet writes for these PEMs with the random order
// replaced by the sorted one: one CERTIFICATE block per distinct certificate.
func sortedPEM(t *testing.T, pems ...string) string {
	t.Helper()
	ders := map[string]bool{}
	for _, p := range pems {
		rest := []byte(p)
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			ders[string(b.Bytes)] = true
		}
	}
	var list []string
	for d := range ders {
		list = append(list, d)
	}
	sort.Strings(list)
	var out strings.Builder
	for _, d := range list {
		out.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(d)}))
	}
	return out.String()
}

type ctbEnv struct {
	*env
	cs     *fake.Clientset
	ctbs   *volume.ClusterTrustBundles
	merges atomic.Int32
}

// newCTBEnv runs a ClusterTrustBundles on a fake clientset holding objs, with
// merges in sorted order, behind a Manager.
func newCTBEnv(t *testing.T, objs ...*certificatesv1.ClusterTrustBundle) *ctbEnv {
	t.Helper()
	cs := fake.NewClientset()
	for _, o := range objs {
		_, err := cs.CertificatesV1().ClusterTrustBundles().Create(context.Background(), o, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	cs.Resources = []*metav1.APIResourceList{{GroupVersion: "certificates.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "clustertrustbundles"}}}}
	e := &ctbEnv{env: &env{root: t.TempDir(), clock: clocktesting.NewFakeClock(start), mounter: &volumetest.RecordingMounter{}}, cs: cs}
	e.sources = volumetest.New(e.clock)
	c, err := volume.NewClusterTrustBundles(volume.ClusterTrustBundlesConfig{Client: cs, Clock: e.clock})
	require.NoError(t, err)
	c.SetShuffle(func([]string) { e.merges.Add(1) })
	e.ctbs = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	// Run must have stored its context before the first lookup.
	require.Eventually(t, func() bool {
		_, err := c.TrustAnchorsByName(context.Background(), "warm-up", true)
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	m, err := volume.New(volume.Config{
		RootDir: e.root, Sources: e.sources, TrustAnchors: c, Clock: e.clock, Mounter: e.mounter,
		NodeAllocatable: corev1.ResourceList{"cpu": resource.MustParse("4")},
	})
	require.NoError(t, err)
	e.m = m
	return e
}

func ctbVolume(name string, sources ...corev1.ClusterTrustBundleProjection) corev1.Volume {
	v := corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o644)}}}
	for i := range sources {
		v.Projected.Sources = append(v.Projected.Sources, corev1.VolumeProjection{ClusterTrustBundle: &sources[i]})
	}
	return v
}

func TestClusterTrustBundleByName(t *testing.T) {
	root0, root1 := caPEM(t, "root0"), caPEM(t, "root1")
	e := newCTBEnv(t, ctb("shop-roots", "", root0+root1+root0, nil))
	ctx := context.Background()

	pod := newPod(ctbVolume("roots",
		corev1.ClusterTrustBundleProjection{Name: ptr.To("shop-roots"), Path: "trust-anchors.pem"},
		corev1.ClusterTrustBundleProjection{Name: ptr.To("does-not-exist"), Optional: ptr.To(true), Path: "sub/empty.pem"},
	))
	require.NoError(t, e.m.Setup(ctx, pod))
	dir := e.dir("projected", "roots")
	assert.Equal(t, sortedPEM(t, root0, root1), read(t, filepath.Join(dir, "trust-anchors.pem")), "duplicates dropped")
	assert.Equal(t, os.FileMode(0o644), mode(t, filepath.Join(dir, "trust-anchors.pem")).Perm())
	assert.Equal(t, "", read(t, filepath.Join(dir, "sub/empty.pem")), "optional and missing: an empty file")

	missing := newPod(ctbVolume("roots", corev1.ClusterTrustBundleProjection{Name: ptr.To("does-not-exist"), Optional: ptr.To(false), Path: "ca.pem"}))
	missing.UID = "other"
	err := e.m.Setup(ctx, missing)
	require.Error(t, err)
	assert.ErrorIs(t, err, volume.ErrSetup)
	assert.Equal(t, `MountVolume.SetUp failed for volume "roots" : while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io "does-not-exist" not found`, err.Error())

	neither := newPod(ctbVolume("roots", corev1.ClusterTrustBundleProjection{Path: "ca.pem"}))
	neither.UID = "third"
	err = e.m.Setup(ctx, neither)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "roots" : ClusterTrustBundle projection requires either name or signerName to be set`, err.Error())

	gid := int64(os.Getgid())
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: &gid}
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, os.FileMode(0o640), mode(t, filepath.Join(dir, "trust-anchors.pem")).Perm(), "0600 widened to 0640 by the fsGroup")
}

func TestClusterTrustBundleBySigner(t *testing.T) {
	alive1, alive2, dead, other, unlabelled := caPEM(t, "alive1"), caPEM(t, "alive2"), caPEM(t, "dead"), caPEM(t, "other"), caPEM(t, "unlabelled")
	e := newCTBEnv(t,
		ctb("example.com:one:a", "example.com/one", alive1, map[string]string{"alive": "true"}),
		ctb("example.com:one:b", "example.com/one", alive2+alive1, map[string]string{"alive": "true"}),
		ctb("example.com:one:c", "example.com/one", dead, map[string]string{"alive": "false"}),
		ctb("example.com:one:d", "example.com/one", unlabelled, nil),
		ctb("example.com:two:a", "example.com/two", other, map[string]string{"alive": "true"}),
	)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		src      corev1.ClusterTrustBundleProjection
		want     string
		wantErr  string
		wantFile bool
	}{
		{name: "matching labels", src: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/one"),
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"alive": "true"}}},
			want: sortedPEM(t, alive1, alive2), wantFile: true},
		{name: "empty selector matches all of the signer", src: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/one"),
			LabelSelector: &metav1.LabelSelector{}},
			want: sortedPEM(t, alive1, alive2, dead, unlabelled), wantFile: true},
		{name: "nil selector matches nothing", src: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/one")},
			wantErr: "combination of signerName and labelSelector matched zero ClusterTrustBundles"},
		{name: "no match, optional", src: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/one"), Optional: ptr.To(true),
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"alive": "unknown"}}},
			want: "", wantFile: true},
		{name: "bad selector", src: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/one"),
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "alive", Operator: "Maybe"}}}},
			wantErr: `while parsing label selector: "Maybe" is not a valid label selector operator`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.src.Path = "bundle.pem"
			pod := newPod(ctbVolume("roots", tc.src))
			pod.UID = typesUID(strings.ReplaceAll(tc.name, " ", "-"))
			err := e.m.Setup(ctx, pod)
			file := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "roots", "bundle.pem")
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, `MountVolume.SetUp failed for volume "roots" : `+tc.wantErr, err.Error())
				assert.NoFileExists(t, file)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, read(t, file))
		})
	}
}

// TestClusterTrustBundleCache: a merge is reused until a bundle of its signer
// changes or the TTL passes, and the change reaches the file on the next Setup.
func TestClusterTrustBundleCache(t *testing.T) {
	root0, root1 := caPEM(t, "root0"), caPEM(t, "root1")
	e := newCTBEnv(t, ctb("example.com:one:a", "example.com/one", root0, map[string]string{"x": "y"}))
	ctx := context.Background()
	pod := newPod(ctbVolume("roots", corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/one"), LabelSelector: &metav1.LabelSelector{}, Path: "ca.pem"}))
	file := filepath.Join(e.dir("projected", "roots"), "ca.pem")

	require.NoError(t, e.m.Setup(ctx, pod))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, int32(1), e.merges.Load(), "the second Setup reuses the merge")
	e.clock.Step(volume.DefaultTrustBundleCacheTTL + time.Second)
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, int32(2), e.merges.Load(), "merged again after the TTL")

	// Another signer's bundle leaves the entry alone.
	_, err := e.cs.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb("example.com:two:a", "example.com/two", root1, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, int32(2), e.merges.Load())

	_, err = e.cs.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb("example.com:one:b", "example.com/one", root1, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, e.m.Setup(ctx, pod))
		assert.Equal(c, sortedPEM(t, root0, root1), read(t, file))
	}, 5*time.Second, 10*time.Millisecond, "a new bundle of the signer reaches the file")

	require.NoError(t, e.cs.CertificatesV1().ClusterTrustBundles().Delete(ctx, "example.com:one:a", metav1.DeleteOptions{}))
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, e.m.Setup(ctx, pod))
		assert.Equal(c, sortedPEM(t, root1), read(t, file))
	}, 5*time.Second, 10*time.Millisecond, "a deleted bundle leaves the file")
}

func TestClusterTrustBundleUnavailable(t *testing.T) {
	ctx := context.Background()
	// No TrustAnchors: the kubelet's static mode.
	e := newEnv(t)
	pod := newPod(ctbVolume("roots", corev1.ClusterTrustBundleProjection{Name: ptr.To("a"), Path: "ca.pem"}))
	err := e.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "roots" : ClusterTrustBundle projection is not supported in static kubelet mode`, err.Error())

	_, err = volume.NewClusterTrustBundles(volume.ClusterTrustBundlesConfig{})
	assert.ErrorIs(t, err, volume.ErrInvalidConfig)

	cs := fake.NewClientset()
	c, err := volume.NewClusterTrustBundles(volume.ClusterTrustBundlesConfig{Client: cs})
	require.NoError(t, err)
	_, err = c.TrustAnchorsByName(ctx, "a", true)
	assert.ErrorIs(t, err, volume.ErrTrustBundlesUnavailable, "not running")

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, err := c.TrustAnchorsBySigner(ctx, "s", &metav1.LabelSelector{}, true)
		assert.ErrorIs(ct, err, volume.ErrTrustBundlesUnavailable)
		assert.ErrorContains(ct, err, "the API server does not serve certificates.k8s.io/v1 clustertrustbundles")
	}, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	_, err = c.TrustAnchorsByName(ctx, "a", true)
	assert.ErrorIs(t, err, volume.ErrTrustBundlesUnavailable, "stopped")
}
