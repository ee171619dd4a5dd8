package cluster

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The aggregation layer's PKI and flags as kubeadm sets them up: kube-apiserver presents a
// front-proxy-client certificate from a CA of its own, and names that CA and client to the
// aggregated API servers it proxies to.
func TestFrontProxyPKIAndFlags(t *testing.T) {
	cfg := Config{Name: "fp", StateDir: t.TempDir(), PeersDir: "/peers"}
	require.NoError(t, cfg.defaults())
	c := &Cluster{cfg: cfg}
	require.NoError(t, c.pki())

	readCert := func(f string) *x509.Certificate {
		b, err := os.ReadFile(c.path("pki", f))
		require.NoError(t, err, f)
		blk, _ := pem.Decode(b)
		require.NotNil(t, blk, f)
		cert, err := x509.ParseCertificate(blk.Bytes)
		require.NoError(t, err, f)
		return cert
	}
	pool := func(certs ...*x509.Certificate) *x509.CertPool {
		p := x509.NewCertPool()
		for _, c := range certs {
			p.AddCert(c)
		}
		return p
	}
	clusterCA, frontProxyCA, client := readCert("ca.crt"), readCert("front-proxy-ca.crt"), readCert("front-proxy-client.crt")
	assert.Equal(t, "front-proxy-client", client.Subject.CommonName)
	clientAuth := x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	clientAuth.Roots = pool(frontProxyCA)
	_, err := client.Verify(clientAuth)
	assert.NoError(t, err, "front-proxy-client under front-proxy-ca")
	clientAuth.Roots = pool(clusterCA)
	_, err = client.Verify(clientAuth)
	assert.Error(t, err, "the front-proxy CA must not be the cluster CA")
	_, err = os.Stat(c.path("pki", "front-proxy-client.key"))
	assert.NoError(t, err)

	args := map[string][]string{}
	for _, l := range c.controlPlaneLaunches() {
		args[l.Name] = l.Args
	}
	for _, want := range []string{
		"--requestheader-client-ca-file=" + c.path("pki", "front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + c.path("pki", "front-proxy-client.crt"),
		"--proxy-client-key-file=" + c.path("pki", "front-proxy-client.key"),
	} {
		assert.Contains(t, args["kube-apiserver"], want)
	}
	assert.Contains(t, args["kube-controller-manager"], "--requestheader-client-ca-file="+c.path("pki", "front-proxy-ca.crt"))
	for name, a := range args {
		for _, f := range a {
			assert.False(t, strings.HasSuffix(f, "="), "%s: empty flag %s", name, f)
		}
	}
}
