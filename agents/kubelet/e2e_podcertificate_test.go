package main_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestKubeletPodCertificates projects a podCertificate into a pod on a real
// node: the kubelet, with the node's credentials, makes the
// PodCertificateRequest, a signer in the test issues it, and the pod sees its
// key and a chain whose leaf certifies that key.
func TestKubeletPodCertificates(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-node-pcr", true)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	caKey, caDER := testSigningCA(t)
	signed := make(chan struct{})
	go func() { defer close(signed); runTestSigner(ctx, t, n.admin, "example.com/test-signer", caKey, caDER) }()
	defer func() { cancel(); <-signed }()

	p := busyboxPod("pcr", n.ctd.BusyboxImage(), corev1.RestartPolicyNever, "sleep 3600")
	p.Spec.ServiceAccountName = "default"
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "certs", MountPath: "/certs"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "certs", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr[int32](0o644),
		Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
			SignerName: "example.com/test-signer", KeyType: "ED25519", MaxExpirationSeconds: ptr[int32](3600),
			CredentialBundlePath: "bundle.pem", KeyPath: "key.pem", CertificateChainPath: "chain.pem",
		}}},
	}}}}
	began := time.Now()
	n.createPod(t, p)
	pod := n.waitPod(t, "pcr", 90*time.Second, "ready", podReady)
	// The kubelet watches its requests: the issued certificate is mounted
	// without waiting for the 10 s retry after the first, failed, setup.
	t.Logf("pod ready %v after creation", time.Since(began).Round(time.Millisecond))
	assert.Less(t, time.Since(began), 9*time.Second, "woken by the request's update, not the retry")
	cat := func(file string) string {
		out, code := n.exec(t, pod, "cat", "/certs/"+file)
		require.Zero(t, code, "cat %s: %s", file, out)
		return out
	}
	keyPEM, chainPEM := cat("key.pem"), cat("chain.pem")
	assert.Equal(t, keyPEM+chainPEM, cat("bundle.pem"))
	kb, _ := pem.Decode([]byte(keyPEM))
	require.NotNil(t, kb)
	require.Equal(t, "PRIVATE KEY", kb.Type)
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	require.NoError(t, err)
	cb, _ := pem.Decode([]byte(chainPEM))
	require.NotNil(t, cb)
	leaf, err := x509.ParseCertificate(cb.Bytes)
	require.NoError(t, err)
	assert.Equal(t, key.(ed25519.PrivateKey).Public(), leaf.PublicKey, "the leaf certifies the pod's key")
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	require.NoError(t, leaf.CheckSignatureFrom(ca))

	pcrs, err := n.admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, pcrs.Items, 1)
	spec := pcrs.Items[0].Spec
	assert.Equal(t, "pcr", spec.PodName)
	assert.Equal(t, pod.UID, spec.PodUID)
	assert.EqualValues(t, n.name, spec.NodeName)
}

func testSigningCA(t *testing.T) (ed25519.PrivateKey, []byte) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test signer"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	require.NoError(t, err)
	return priv, der
}

// runTestSigner issues every unanswered PodCertificateRequest of signer in the
// default namespace, as the e2e tests' hermetic signer does, until ctx ends.
func runTestSigner(ctx context.Context, t *testing.T, cs kubernetes.Interface, signer string, caKey ed25519.PrivateKey, caDER []byte) {
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Errorf("signer: %v", err)
		return
	}
	for ctx.Err() == nil {
		list, err := cs.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range list.Items {
				pcr := &list.Items[i]
				if pcr.Spec.SignerName != signer || len(pcr.Status.Conditions) > 0 {
					continue
				}
				req, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
				if err != nil {
					t.Errorf("signer: %v", err)
					continue
				}
				notBefore := time.Now().Add(-2 * time.Minute)
				notAfter := notBefore.Add(time.Duration(*pcr.Spec.MaxExpirationSeconds) * time.Second)
				der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()),
					NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
					ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, req.PublicKey, caKey)
				if err != nil {
					t.Errorf("signer: %v", err)
					continue
				}
				pcr.Status.Conditions = []metav1.Condition{{Type: certificatesv1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue,
					Reason: "Reason", Message: "Issued", LastTransitionTime: metav1.Now()}}
				pcr.Status.CertificateChain = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
				pcr.Status.NotBefore = ptr(metav1.NewTime(notBefore))
				pcr.Status.BeginRefreshAt = ptr(metav1.NewTime(notAfter.Add(-30 * time.Minute)))
				pcr.Status.NotAfter = ptr(metav1.NewTime(notAfter))
				if _, err := cs.CertificatesV1().PodCertificateRequests("default").UpdateStatus(ctx, pcr, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
					t.Logf("signer: %v", err)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
