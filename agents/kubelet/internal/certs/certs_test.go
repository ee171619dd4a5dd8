package certs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/connrotation"
	clocktesting "k8s.io/utils/clock/testing"
)

// selfSigned returns a PEM certificate and key valid from notBefore to notAfter.
func selfSigned(t *testing.T, cn string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeKubeconfigWith(t *testing.T, path string, auth *clientcmdapi.AuthInfo) {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", InsecureSkipTLSVerify: true}
	c.AuthInfos["u"] = auth
	c.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	c.CurrentContext = "x"
	require.NoError(t, clientcmd.WriteToFile(*c, path))
}

func TestNeedsBootstrap(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	validCert, validKey := selfSigned(t, "system:node:a", now.Add(-time.Hour), now.Add(time.Hour))
	oldCert, oldKey := selfSigned(t, "system:node:a", now.Add(-2*time.Hour), now.Add(-time.Hour))
	pemPath := filepath.Join(dir, "pair.pem")
	require.NoError(t, os.WriteFile(pemPath, append(append([]byte{}, validCert...), validKey...), 0o600))
	notAFile := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(notAFile, []byte("x"), 0o600))

	tests := []struct {
		name    string
		setup   func(path string)
		want    bool
		wantErr bool
	}{
		{name: "missing", setup: func(string) {}, want: true},
		{name: "not YAML", setup: func(p string) { require.NoError(t, os.WriteFile(p, []byte("{{{"), 0o600)) }, want: true},
		{name: "empty", setup: func(p string) { require.NoError(t, os.WriteFile(p, nil, 0o600)) }, want: true},
		{name: "token, no certificate", setup: func(p string) {
			writeKubeconfigWith(t, p, &clientcmdapi.AuthInfo{Token: "abcdef.0123456789abcdef"})
		}, want: true},
		{name: "valid embedded certificate", setup: func(p string) {
			writeKubeconfigWith(t, p, &clientcmdapi.AuthInfo{ClientCertificateData: validCert, ClientKeyData: validKey})
		}, want: false},
		{name: "valid certificate file, as a bootstrap writes it", setup: func(p string) {
			writeKubeconfigWith(t, p, &clientcmdapi.AuthInfo{ClientCertificate: pemPath, ClientKey: pemPath})
		}, want: false},
		{name: "expired certificate", setup: func(p string) {
			writeKubeconfigWith(t, p, &clientcmdapi.AuthInfo{ClientCertificateData: oldCert, ClientKeyData: oldKey})
		}, want: true},
		{name: "certificate file missing", setup: func(p string) {
			writeKubeconfigWith(t, p, &clientcmdapi.AuthInfo{ClientCertificate: filepath.Join(dir, "nope.pem"), ClientKey: filepath.Join(dir, "nope.pem")})
		}, want: true},
		{name: "a directory", setup: func(p string) { require.NoError(t, os.Mkdir(p, 0o700)) }, want: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "kubeconfig-"+string(rune('a'+i)))
			tt.setup(path)
			got, err := NeedsBootstrap(context.Background(), path)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	t.Run("stat error other than not-exist", func(t *testing.T) {
		path := filepath.Join(notAFile, "kubeconfig")
		_, err := NeedsBootstrap(context.Background(), path)
		require.Error(t, err)
		assert.Contains(t, err.Error(), path)
	})
}

func TestWriteKubeconfig(t *testing.T) {
	dir := t.TempDir()
	pemPath := filepath.Join(dir, "pki", "kubelet-client-current.pem")
	t.Run("CA file kept as a file", func(t *testing.T) {
		path := filepath.Join(dir, "a.kubeconfig")
		bc := &rest.Config{Host: "https://10.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAFile: "/etc/kubernetes/pki/ca.crt", CAData: []byte("ignored")}, BearerToken: "abcdef.0123456789abcdef"}
		require.NoError(t, WriteKubeconfig(bc, path, pemPath))
		got, err := clientcmd.LoadFromFile(path)
		require.NoError(t, err)
		assert.Equal(t, "default-context", got.CurrentContext)
		ctx := got.Contexts["default-context"]
		require.NotNil(t, ctx)
		assert.Equal(t, "default-cluster", ctx.Cluster)
		assert.Equal(t, "default-auth", ctx.AuthInfo)
		assert.Equal(t, "default", ctx.Namespace)
		cl := got.Clusters["default-cluster"]
		require.NotNil(t, cl)
		assert.Equal(t, "https://10.0.0.1:6443", cl.Server)
		assert.Equal(t, "/etc/kubernetes/pki/ca.crt", cl.CertificateAuthority)
		assert.Empty(t, cl.CertificateAuthorityData)
		au := got.AuthInfos["default-auth"]
		require.NotNil(t, au)
		assert.Equal(t, pemPath, au.ClientCertificate)
		assert.Equal(t, pemPath, au.ClientKey)
		assert.Empty(t, au.Token, "the bootstrap token must not be copied")
	})
	t.Run("CA data embedded when there is no file", func(t *testing.T) {
		path := filepath.Join(dir, "b.kubeconfig")
		bc := &rest.Config{Host: "https://10.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("PEM")}}
		require.NoError(t, WriteKubeconfig(bc, path, pemPath))
		got, err := clientcmd.LoadFromFile(path)
		require.NoError(t, err)
		assert.Equal(t, []byte("PEM"), got.Clusters["default-cluster"].CertificateAuthorityData)
		assert.Empty(t, got.Clusters["default-cluster"].CertificateAuthority)
	})
	t.Run("unwritable path is named", func(t *testing.T) {
		path := filepath.Join(dir, "b.kubeconfig", "under-a-file")
		err := WriteKubeconfig(&rest.Config{Host: "https://x"}, path, pemPath)
		require.Error(t, err)
		assert.Contains(t, err.Error(), path)
	})
}

func TestNewClientBadInput(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.kubeconfig")
	require.NoError(t, os.WriteFile(garbage, []byte("{{{"), 0o600))
	noContext := filepath.Join(dir, "nocontext.kubeconfig")
	require.NoError(t, os.WriteFile(noContext, []byte("apiVersion: v1\nkind: Config\n"), 0o600))
	missing := filepath.Join(dir, "missing.kubeconfig")
	tests := []struct {
		name     string
		cfg      Config
		sentinel error
		mention  string
	}{
		{name: "no node name", cfg: Config{Kubeconfig: "k"}, sentinel: ErrInvalidConfig},
		{name: "no kubeconfig", cfg: Config{NodeName: "n"}, sentinel: ErrInvalidConfig},
		{name: "no cert dir", cfg: Config{NodeName: "n", Kubeconfig: "k", BootstrapKubeconfig: "b"}, sentinel: ErrInvalidConfig, mention: "--cert-dir"},
		{name: "bootstrap kubeconfig missing", cfg: Config{NodeName: "n", Kubeconfig: filepath.Join(dir, "k1"), BootstrapKubeconfig: missing, CertDir: dir}, sentinel: ErrInvalidKubeconfig, mention: missing},
		{name: "bootstrap kubeconfig not YAML", cfg: Config{NodeName: "n", Kubeconfig: filepath.Join(dir, "k2"), BootstrapKubeconfig: garbage, CertDir: dir}, sentinel: ErrInvalidKubeconfig, mention: garbage},
		{name: "bootstrap kubeconfig without a context", cfg: Config{NodeName: "n", Kubeconfig: filepath.Join(dir, "k3"), BootstrapKubeconfig: noContext, CertDir: dir}, sentinel: ErrInvalidKubeconfig, mention: noContext},
		{name: "rotating, bootstrap kubeconfig not YAML", cfg: Config{NodeName: "n", Kubeconfig: filepath.Join(dir, "k4"), BootstrapKubeconfig: garbage, CertDir: dir, Rotate: true}, sentinel: ErrInvalidKubeconfig, mention: garbage},
		{name: "kubeconfig missing, no bootstrap", cfg: Config{NodeName: "n", Kubeconfig: missing, CertDir: dir}, sentinel: ErrInvalidKubeconfig, mention: missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := NewClient(ctx, tt.cfg)
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.sentinel)
			if tt.mention != "" {
				assert.Contains(t, err.Error(), tt.mention)
			}
			if tt.cfg.BootstrapKubeconfig != "" && tt.sentinel == ErrInvalidKubeconfig {
				assert.Contains(t, err.Error(), "bootstrap kubeconfig")
			}
		})
	}
}

func TestNewClientValidKubeconfigSkipsBootstrap(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	cert, key := selfSigned(t, "system:node:a", now.Add(-time.Hour), now.Add(time.Hour))
	kc := filepath.Join(dir, "kubeconfig")
	writeKubeconfigWith(t, kc, &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key})
	// The bootstrap kubeconfig is unreadable: any attempt to use it fails the test.
	bad := filepath.Join(dir, "bootstrap.kubeconfig")
	require.NoError(t, os.WriteFile(bad, []byte("{{{"), 0o600))
	for _, rotate := range []bool{false, true} {
		c, err := NewClient(context.Background(), Config{NodeName: "a", Kubeconfig: kc, BootstrapKubeconfig: bad, CertDir: filepath.Join(dir, "pki"), Rotate: rotate})
		require.NoError(t, err, "rotate=%v", rotate)
		assert.Equal(t, "https://127.0.0.1:6443", c.RESTConfig().Host)
		if rotate {
			// The embedded certificate seeds the store, as upstream's kubeadm path.
			require.NotNil(t, c.Current())
			assert.Equal(t, "system:node:a", c.Current().Leaf.Subject.CommonName)
			assert.NotNil(t, c.RESTConfig().Transport)
			require.NoError(t, c.WaitForCertificate(context.Background()))
		}
	}
}

func TestDigestedName(t *testing.T) {
	k1, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	k2, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	subj := &pkix.Name{CommonName: "system:node:a", Organization: []string{"system:nodes"}}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	a, err := digestedName(k1.Public(), subj, usages)
	require.NoError(t, err)
	again, err := digestedName(k1.Public(), subj, usages)
	require.NoError(t, err)
	assert.Equal(t, a, again, "the same request must get the same name")
	assert.Regexp(t, `^node-csr-[A-Za-z0-9_-]{43}$`, a)
	other, err := digestedName(k2.Public(), subj, usages)
	require.NoError(t, err)
	assert.NotEqual(t, a, other)
	// "system:node:a"+"b" must not collide with "system:node:ab"+"".
	x, _ := digestedName(k1.Public(), &pkix.Name{CommonName: "system:node:a", Organization: []string{"bsystem:nodes"}}, usages)
	y, _ := digestedName(k1.Public(), &pkix.Name{CommonName: "system:node:ab", Organization: []string{"system:nodes"}}, usages)
	assert.NotEqual(t, x, y)
}

func TestDedupSANs(t *testing.T) {
	names, ips := dedupSANs([]string{"node-b", "", "10.0.0.2", "node-a", "node-b"}, []net.IP{net.ParseIP("10.0.0.2"), net.ParseIP("10.0.0.1"), nil})
	assert.Equal(t, []string{"node-a", "node-b"}, names)
	assert.Equal(t, []string{"10.0.0.1", "10.0.0.2"}, []string{ips[0].String(), ips[1].String()})
	assert.Len(t, ips, 2)
}

// fakeManager is a certificate.Manager whose certificate the test sets.
type fakeManager struct {
	mu      sync.Mutex
	cert    *tls.Certificate
	healthy bool
	started bool
	stopped bool
}

func (f *fakeManager) Start()              { f.mu.Lock(); f.started = true; f.mu.Unlock() }
func (f *fakeManager) Stop()               { f.mu.Lock(); f.stopped = true; f.mu.Unlock() }
func (f *fakeManager) ServerHealthy() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.healthy }
func (f *fakeManager) Current() *tls.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cert
}
func (f *fakeManager) set(c *tls.Certificate) { f.mu.Lock(); f.cert = c; f.mu.Unlock() }

func TestRunClosesConnectionsOnRotation(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	clk := clocktesting.NewFakeClock(time.Now())
	fm := &fakeManager{cert: &tls.Certificate{}}
	d := connrotation.NewDialer((&net.Dialer{}).DialContext)
	c := &Client{cfg: Config{NodeName: "a", CheckPeriod: 10 * time.Second, ExitAfter: 5 * time.Minute, Clock: clk}, manager: fm, dialer: d}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	conn, err := d.DialContext(ctx, "tcp", l.Addr().String())
	require.NoError(t, err)
	defer conn.Close()

	waitTicker := func() {
		require.Eventually(t, clk.HasWaiters, 5*time.Second, 10*time.Millisecond)
	}
	waitTicker()
	// Same certificate: the connection stays.
	clk.Step(10 * time.Second)
	time.Sleep(50 * time.Millisecond)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "connection closed without a rotation: %v", err)

	// A new certificate: the next check closes it.
	fm.set(&tls.Certificate{})
	clk.Step(10 * time.Second)
	require.Eventually(t, func() bool {
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := conn.Read(make([]byte, 1))
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}, 5*time.Second, 30*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	assert.True(t, fm.started)
	assert.True(t, fm.stopped)
}

func TestRunFailsWithoutCertificateWhileServerHealthy(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	fm := &fakeManager{healthy: true}
	c := &Client{cfg: Config{NodeName: "a", CheckPeriod: 10 * time.Second, ExitAfter: time.Minute, Clock: clk}, manager: fm,
		dialer: connrotation.NewDialer((&net.Dialer{}).DialContext)}
	done := make(chan error)
	go func() { done <- c.Run(context.Background()) }()
	for i := 0; i < 7; i++ {
		require.Eventually(t, clk.HasWaiters, 5*time.Second, 10*time.Millisecond)
		clk.Step(10 * time.Second)
	}
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrNoClientCertificate)
		assert.Contains(t, err.Error(), "node a")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not give up without a certificate")
	}
}
