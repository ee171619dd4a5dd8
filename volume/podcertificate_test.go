package volume_test

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

type pcEnv struct {
	*env
	cs *fake.Clientset
}

func newPCEnv(t *testing.T) *pcEnv {
	t.Helper()
	cs := fake.NewClientset(
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart", UID: "sa-uid"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "node-uid"}},
	)
	var n atomic.Int32
	e := &pcEnv{env: &env{root: t.TempDir(), clock: clocktesting.NewFakeClock(start), mounter: &volumetest.RecordingMounter{}}, cs: cs}
	// The fake does not implement generateName or creation timestamps.
	cs.PrependReactor("create", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pcr := a.(k8stesting.CreateAction).GetObject().(*certificatesv1.PodCertificateRequest)
		pcr.Name = fmt.Sprintf("%s%d", pcr.GenerateName, n.Add(1))
		pcr.CreationTimestamp = metav1.NewTime(e.clock.Now())
		return false, nil, nil
	})
	e.sources = volumetest.New(e.clock)
	pc, err := volume.NewPodCertificateIssuer(volume.PodCertificateIssuerConfig{Client: cs, NodeName: "node-1", Clock: e.clock})
	require.NoError(t, err)
	pc.SetJitter(0)
	m, err := volume.New(volume.Config{RootDir: e.root, Sources: e.sources, PodCertificates: pc, Clock: e.clock, Mounter: e.mounter})
	require.NoError(t, err)
	e.m = m
	return e
}

func (e *pcEnv) requests(t *testing.T) []certificatesv1.PodCertificateRequest {
	t.Helper()
	l, err := e.cs.CertificatesV1().PodCertificateRequests("shop").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	return l.Items
}

// issue answers the request as a signer would, returning the chain it set.
func (e *pcEnv) issue(t *testing.T, name string, beginRefresh time.Time) string {
	t.Helper()
	pcr, err := e.cs.CertificatesV1().PodCertificateRequests("shop").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	chain := caPEM(t, name+"-leaf") + caPEM(t, name+"-intermediate")
	pcr.Status = certificatesv1.PodCertificateRequestStatus{
		Conditions:       []metav1.Condition{{Type: "Issued", Status: "True", Reason: "Issued"}},
		CertificateChain: chain,
		BeginRefreshAt:   ptr.To(metav1.NewTime(beginRefresh)),
		NotAfter:         ptr.To(metav1.NewTime(beginRefresh.Add(time.Hour))),
	}
	_, err = e.cs.CertificatesV1().PodCertificateRequests("shop").UpdateStatus(context.Background(), pcr, metav1.UpdateOptions{})
	require.NoError(t, err)
	return chain
}

func pcVolume(src corev1.PodCertificateProjection) corev1.Volume {
	return corev1.Volume{Name: "certs", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o644),
		Sources:     []corev1.VolumeProjection{{PodCertificate: &src}},
	}}}
}

func TestPodCertificateIssueAndRefresh(t *testing.T) {
	e := newPCEnv(t)
	ctx := context.Background()
	pod := newPod(pcVolume(corev1.PodCertificateProjection{SignerName: "example.com/spiffe", KeyType: "ED25519",
		MaxExpirationSeconds: ptr.To[int32](3600), UserAnnotations: map[string]string{"a": "b"},
		CredentialBundlePath: "bundle.pem", KeyPath: "key.pem", CertificateChainPath: "chain.pem"}))

	err := e.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "certs" : credential bundle is not issued yet`, err.Error())
	reqs := e.requests(t)
	require.Len(t, reqs, 1)
	r := reqs[0]
	assert.Equal(t, "req-1", r.Name)
	assert.Equal(t, []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "cart-0", UID: uid}}, r.OwnerReferences)
	assert.Equal(t, certificatesv1.PodCertificateRequestSpec{
		SignerName: "example.com/spiffe", PodName: "cart-0", PodUID: uid, ServiceAccountName: "cart", ServiceAccountUID: "sa-uid",
		NodeName: "node-1", NodeUID: "node-uid", MaxExpirationSeconds: ptr.To[int32](3600),
		StubPKCS10Request: r.Spec.StubPKCS10Request, UnverifiedUserAnnotations: map[string]string{"a": "b"},
	}, r.Spec)
	csr, err := x509.ParseCertificateRequest(r.Spec.StubPKCS10Request)
	require.NoError(t, err)
	require.NoError(t, csr.CheckSignature(), "the stub request proves possession of the key")

	// Not answered yet: still waiting, no second request.
	require.Error(t, e.m.Setup(ctx, pod))
	assert.Len(t, e.requests(t), 1)

	chain1 := e.issue(t, "req-1", start.Add(30*time.Minute))
	require.NoError(t, e.m.Setup(ctx, pod))
	dir := e.dir("projected", "certs")
	key := read(t, filepath.Join(dir, "key.pem"))
	blk, _ := pem.Decode([]byte(key))
	require.NotNil(t, blk)
	assert.Equal(t, "PRIVATE KEY", blk.Type)
	priv, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	require.NoError(t, err)
	assert.Equal(t, csr.PublicKey, priv.(ed25519.PrivateKey).Public(), "the key is the one the request was for")
	assert.Equal(t, chain1, read(t, filepath.Join(dir, "chain.pem")))
	assert.Equal(t, key+chain1, read(t, filepath.Join(dir, "bundle.pem")), "key first, then the chain")
	assert.Equal(t, os.FileMode(0o644), mode(t, filepath.Join(dir, "key.pem")).Perm())

	// Before beginRefreshAt nothing new is asked for.
	e.clock.SetTime(start.Add(29 * time.Minute))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Len(t, e.requests(t), 1)

	// After it a new request is made and the old credentials stay until it is issued.
	e.clock.SetTime(start.Add(31 * time.Minute))
	require.NoError(t, e.m.Setup(ctx, pod))
	require.Len(t, e.requests(t), 2)
	assert.Equal(t, key, read(t, filepath.Join(dir, "key.pem")))
	chain2 := e.issue(t, "req-2", start.Add(61*time.Minute))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, chain2, read(t, filepath.Join(dir, "chain.pem")))
	assert.NotEqual(t, key, read(t, filepath.Join(dir, "key.pem")), "a fresh key with the refresh")
	assert.Len(t, e.requests(t), 2)

	// Teardown forgets: the same UID starts over.
	require.NoError(t, e.m.Teardown(ctx, pod.UID))
	require.Error(t, e.m.Setup(ctx, pod))
	assert.Len(t, e.requests(t), 3)
}

func TestPodCertificateDeniedAndErrors(t *testing.T) {
	e := newPCEnv(t)
	ctx := context.Background()
	pod := newPod(pcVolume(corev1.PodCertificateProjection{SignerName: "example.com/spiffe", KeyType: "ECDSAP256", CredentialBundlePath: "b.pem"}))
	require.Error(t, e.m.Setup(ctx, pod))
	pcr, err := e.cs.CertificatesV1().PodCertificateRequests("shop").Get(ctx, "req-1", metav1.GetOptions{})
	require.NoError(t, err)
	pcr.Status.Conditions = []metav1.Condition{{Type: "Denied", Status: "True", Reason: "NotAllowed", Message: "no"}}
	_, err = e.cs.CertificatesV1().PodCertificateRequests("shop").UpdateStatus(ctx, pcr, metav1.UpdateOptions{})
	require.NoError(t, err)
	for range 2 {
		err = e.m.Setup(ctx, pod)
		require.Error(t, err)
		assert.Equal(t, `MountVolume.SetUp failed for volume "certs" : PodCertificateRequest was permanently denied: reason="NotAllowed" message="no"`, err.Error())
	}
	assert.Len(t, e.requests(t), 1, "denied is final")

	bad := newPod(pcVolume(corev1.PodCertificateProjection{SignerName: "example.com/spiffe", KeyType: "DSA", CredentialBundlePath: "b.pem"}))
	bad.UID = "bad"
	err = e.m.Setup(ctx, bad)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "certs" : while creating initial PodCertificateRequest: while generating keypair: unknown key type "DSA"`, err.Error())

	nosa := newPod(pcVolume(corev1.PodCertificateProjection{SignerName: "example.com/spiffe", KeyType: "ED25519", CredentialBundlePath: "b.pem"}))
	nosa.UID, nosa.Spec.ServiceAccountName = "nosa", "ghost"
	err = e.m.Setup(ctx, nosa)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "certs" : while creating initial PodCertificateRequest: while fetching service account: serviceaccounts "ghost" not found`, err.Error())

	// Without PodCertificates.
	plain := newEnv(t)
	err = plain.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "podCertificate projection is not supported")
}
