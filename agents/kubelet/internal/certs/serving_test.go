package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/certs"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestServingCertificate requests a serving certificate from a real control plane
// whose kube-controller-manager runs the CSR approving and signing controllers: the
// kubelet-serving CSR is not approved automatically, an administrator approves it,
// the signer signs it, and GetCertificate serves it.
func TestServingCertificate(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true, Controllers: []string{
		"certificatesigningrequest-approving-controller", "certificatesigningrequest-signing-controller",
	}})
	const node = "serving-a"
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := certs.NewServing(ctx, certs.ServingConfig{
		NodeName: node, Client: cp.NodeClient(node),
		Hostnames: []string{node}, IPs: []net.IP{net.ParseIP("10.1.2.3")}, CertDir: dir,
	})
	require.NoError(t, err)
	_, err = s.GetCertificate(&tls.ClientHelloInfo{})
	require.ErrorIs(t, err, certs.ErrNoServingCertificate)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	admin := cp.AdminClient()
	var csr *certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		l, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for i := range l.Items {
			if l.Items[i].Spec.SignerName == certificatesv1.KubeletServingSignerName && l.Items[i].Spec.Username == "system:node:"+node {
				csr = &l.Items[i]
				return true
			}
		}
		return false
	}, 30*time.Second, 200*time.Millisecond, "no kubelet-serving CSR from the node")
	assert.ElementsMatch(t, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}, csr.Spec.Usages)

	time.Sleep(2 * time.Second)
	csr, err = admin.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
	require.NoError(t, err)
	require.Empty(t, csr.Status.Conditions, "kube-controller-manager acted on a serving CSR by itself")
	_, err = s.GetCertificate(&tls.ClientHelloInfo{})
	require.ErrorIs(t, err, certs.ErrNoServingCertificate)

	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "TestApproved", Message: "approved by the test",
	})
	_, err = admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	require.NoError(t, err)

	var got *tls.Certificate
	require.Eventually(t, func() bool {
		got, err = s.GetCertificate(&tls.ClientHelloInfo{ServerName: node})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "GetCertificate never returned the approved certificate")
	leaf := got.Leaf
	require.NotNil(t, leaf)
	assert.Equal(t, "system:node:"+node, leaf.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, leaf.Subject.Organization)
	assert.Equal(t, []string{node}, leaf.DNSNames)
	require.Len(t, leaf.IPAddresses, 1)
	assert.Equal(t, "10.1.2.3", leaf.IPAddresses[0].String())
	caPEM, err := os.ReadFile(cp.CAFile())
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: node, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.NoError(t, err, "the served certificate does not verify against the cluster CA")

	target, err := os.Readlink(filepath.Join(dir, "kubelet-server-current.pem"))
	require.NoError(t, err)
	assert.Regexp(t, `^kubelet-server-.*\.pem$`, filepath.Base(target))

	// A TLS server with GetCertificate presents it.
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: s.GetCertificate, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: pool, ServerName: node, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	assert.Equal(t, leaf.SerialNumber, conn.ConnectionState().PeerCertificates[0].SerialNumber)
	conn.Close()

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNewServingBadInput(t *testing.T) {
	_, err := certs.NewServing(context.Background(), certs.ServingConfig{NodeName: "n", CertDir: t.TempDir(), IPs: []net.IP{net.ParseIP("10.0.0.1")}})
	assert.True(t, errors.Is(err, certs.ErrInvalidConfig), "%v", err)
}
