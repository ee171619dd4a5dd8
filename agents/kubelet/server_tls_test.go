package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	certutil "k8s.io/client-go/util/cert"
)

func leaf(t *testing.T, tc *tls.Config) *x509.Certificate {
	t.Helper()
	c, err := tc.GetCertificate(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	x, err := x509.ParseCertificate(c.Certificate[0])
	require.NoError(t, err)
	return x
}

func TestServingTLSSelfSigned(t *testing.T) {
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "pki")
	st, err := buildServingTLS(cfg, dir, "worker-3", nil, dynamiccertificates.NewUnionCAContentProvider())
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "kubelet.crt"), st.certFile)
	assert.Equal(t, filepath.Join(dir, "kubelet.key"), st.keyFile)
	first, err := os.ReadFile(st.certFile)
	require.NoError(t, err)
	x := leaf(t, st.config)
	assert.Contains(t, x.DNSNames, "worker-3")
	assert.Equal(t, tls.NoClientCert, st.config.ClientAuth, "no client CA: no client certificate asked")
	assert.Nil(t, st.config.GetConfigForClient)

	// Made once: a second start keeps the same files.
	st2, err := buildServingTLS(cfg, dir, "worker-3", nil, dynamiccertificates.NewUnionCAContentProvider())
	require.NoError(t, err)
	again, err := os.ReadFile(st2.certFile)
	require.NoError(t, err)
	assert.Equal(t, first, again)
}

func TestServingTLSFilesCiphersAndClientCA(t *testing.T) {
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	dir := t.TempDir()
	cert, key, err := certutil.GenerateSelfSignedCertKey("from-files", nil, nil)
	require.NoError(t, err)
	cfg.TLSCertFile, cfg.TLSPrivateKeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(cfg.TLSCertFile, cert, 0o600))
	require.NoError(t, os.WriteFile(cfg.TLSPrivateKeyFile, key, 0o600))
	cfg.TLSCipherSuites = []string{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}
	cfg.TLSMinVersion = "VersionTLS12"
	ca := newTestCA(t, "cluster-ca")
	cfg.Authentication.X509.ClientCAFile = ca.write(t)
	caProvider, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", cfg.Authentication.X509.ClientCAFile)
	require.NoError(t, err)

	certDir := filepath.Join(dir, "pki")
	st, err := buildServingTLS(cfg, certDir, "worker-3", nil, caProvider)
	require.NoError(t, err)
	assert.Equal(t, "from-files", leaf(t, st.config).Subject.CommonName[:len("from-files")])
	_, err = os.Stat(certDir)
	assert.True(t, os.IsNotExist(err), "no self-signed certificate with tlsCertFile set")
	assert.Equal(t, []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384}, st.config.CipherSuites)
	assert.Equal(t, uint16(tls.VersionTLS12), st.config.MinVersion)
	assert.Equal(t, tls.RequestClientCert, st.config.ClientAuth, "asked, not required: the authenticator decides")
	require.NotNil(t, st.config.GetConfigForClient)
	perClient, err := st.config.GetConfigForClient(&tls.ClientHelloInfo{ServerName: "worker-3"})
	require.NoError(t, err)
	require.NotNil(t, perClient.ClientCAs)
	block, _ := pem.Decode(ca.pem)
	caCert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	assert.True(t, perClient.ClientCAs.Equal(pool))
}

func TestServingTLSGetCertificateHook(t *testing.T) {
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	cert, key, err := certutil.GenerateSelfSignedCertKey("rotated", nil, nil)
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(cert, key)
	require.NoError(t, err)
	calls := 0
	hook := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { calls++; return &pair, nil }
	dir := filepath.Join(t.TempDir(), "pki")
	st, err := buildServingTLS(cfg, dir, "worker-3", hook, dynamiccertificates.NewUnionCAContentProvider())
	require.NoError(t, err)
	assert.Equal(t, "rotated", leaf(t, st.config).Subject.CommonName[:len("rotated")])
	assert.Equal(t, 1, calls)
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "the hook replaces the self-signed certificate")
	assert.Empty(t, st.certFile)
}

func TestServingTLSErrors(t *testing.T) {
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	cfg.TLSCipherSuites = []string{"TLS_NO_SUCH_SUITE"}
	_, err = buildServingTLS(cfg, t.TempDir(), "h", nil, nil)
	assert.Error(t, err)
	cfg.TLSCipherSuites = nil
	cfg.TLSMinVersion = "VersionTLS99"
	_, err = buildServingTLS(cfg, t.TempDir(), "h", nil, nil)
	assert.Error(t, err)
	cfg.TLSMinVersion = ""
	cfg.TLSCertFile, cfg.TLSPrivateKeyFile = "/no/such.crt", "/no/such.key"
	_, err = buildServingTLS(cfg, t.TempDir(), "h", nil, nil)
	assert.Error(t, err)
}

// The server's KubeletConfiguration fields: defaults, honoured (not reported as
// ignored) and validated with the field named.
func TestServerConfigFields(t *testing.T) {
	cfg, ignored, err := loadConfig(writeConfig(t, header+`
address: 127.0.0.1
port: 10250
enableServer: true
enableDebuggingHandlers: true
tlsCertFile: /etc/kubelet/tls.crt
tlsPrivateKeyFile: /etc/kubelet/tls.key
tlsCipherSuites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
tlsMinVersion: VersionTLS12
authentication:
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
  webhook: {enabled: true, cacheTTL: 1m}
  anonymous: {enabled: false}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 10s}
`))
	require.NoError(t, err)
	assert.Empty(t, ignored)
	require.NoError(t, validateConfig(cfg))

	def, _, err := loadConfig("")
	require.NoError(t, err)
	assert.Equal(t, "0.0.0.0", def.Address)
	assert.False(t, *def.Authentication.Anonymous.Enabled)
	assert.True(t, *def.Authentication.Webhook.Enabled)
	assert.Equal(t, "2m0s", def.Authentication.Webhook.CacheTTL.Duration.String())
	assert.Equal(t, "Webhook", string(def.Authorization.Mode))
	assert.Equal(t, "5m0s", def.Authorization.Webhook.CacheAuthorizedTTL.Duration.String())
	assert.Equal(t, "30s", def.Authorization.Webhook.CacheUnauthorizedTTL.Duration.String())
	assert.True(t, *def.EnableDebuggingHandlers)
	assert.True(t, *def.EnableServer)

	for _, tc := range []struct{ body, want string }{
		{"port: 70000\n", "port (--port) 70000 must be between 1 and 65535, inclusive"},
		{"address: not-an-ip\n", `address "not-an-ip" is not a valid IP address`},
		{"tlsCipherSuites: [TLS_BOGUS]\n", "tlsCipherSuites: "},
		{"tlsMinVersion: VersionTLS99\n", "tlsMinVersion: "},
		{"tlsCertFile: /a.crt\n", `tlsCertFile "/a.crt" and tlsPrivateKeyFile "" must be set together`},
		{"authorization: {mode: RBAC}\n", `authorization.mode "RBAC": unknown authorization mode`},
		{"authentication: {webhook: {cacheTTL: -1s}}\n", "authentication.webhook.cacheTTL -1s must not be negative"},
	} {
		c, _, err := loadConfig(writeConfig(t, header+tc.body))
		require.NoError(t, err)
		err = validateConfig(c)
		require.Error(t, err, tc.body)
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tc.want)
	}
}
