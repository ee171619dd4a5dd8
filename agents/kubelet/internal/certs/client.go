package certs

import (
	"context"
	"crypto"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/transport"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/connrotation"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/utils/clock"
)

var (
	// ErrInvalidConfig wraps errors about a Config or ServingConfig.
	ErrInvalidConfig = errors.New("invalid certificate configuration")
	// ErrInvalidKubeconfig wraps errors about a kubeconfig file that cannot be used;
	// the message names the file.
	ErrInvalidKubeconfig = errors.New("invalid kubeconfig")
	// ErrNoClientCertificate is returned by Client.Run when no valid client
	// certificate has been available for Config.ExitAfter while the API server
	// answers: the process should exit so it can bootstrap again.
	ErrNoClientCertificate = errors.New("no valid client certificate")
)

// The file names upstream uses in the certificate directory.
const (
	clientPairPrefix  = "kubelet-client"
	servingPairPrefix = "kubelet-server"
	tmpPrivateKeyFile = "kubelet-client.key.tmp"
)

// Config says where the kubelet's API credentials live and how to obtain them.
type Config struct {
	// NodeName is the node's name: the certificates are for system:node:NodeName.
	// Required.
	NodeName string
	// Kubeconfig is --kubeconfig: read when valid, written after a bootstrap.
	// Required.
	Kubeconfig string
	// BootstrapKubeconfig is --bootstrap-kubeconfig. Empty means no bootstrap: the
	// kubeconfig must be usable as it is.
	BootstrapKubeconfig string
	// CertDir is --cert-dir, where kubelet-client-*.pem are kept. Required with
	// BootstrapKubeconfig or Rotate.
	CertDir string
	// Rotate is the KubeletConfiguration's rotateCertificates.
	Rotate bool
	// CheckPeriod is how often the API client's transport checks whether the
	// certificate manager has a new certificate, and closes its connections if so.
	// Zero means 10s, as upstream.
	CheckPeriod time.Duration
	// ExitAfter is how long Run tolerates having no valid client certificate while
	// the API server answers before it fails with ErrNoClientCertificate. Zero means
	// 5m, as upstream.
	ExitAfter time.Duration
	// RenewFailures counts failed certificate renewals
	// (kubelet_certificate_manager_client_expiration_renew_errors). Nil: not counted.
	RenewFailures certificate.Counter
	// Clock drives CheckPeriod and ExitAfter. Nil means the real clock.
	Clock clock.WithTicker
}

// Client holds the kubelet's API client configuration and, with rotation, the
// client certificate manager behind it.
type Client struct {
	cfg     Config
	rest    *rest.Config
	manager certificate.Manager
	dialer  *connrotation.Dialer
}

func (c *Config) validate() error {
	switch {
	case c.NodeName == "":
		return fmt.Errorf("%w: the node name is empty", ErrInvalidConfig)
	case c.Kubeconfig == "":
		return fmt.Errorf("%w: --kubeconfig is empty", ErrInvalidConfig)
	case c.CertDir == "" && (c.BootstrapKubeconfig != "" || c.Rotate):
		return fmt.Errorf("%w: --cert-dir is empty", ErrInvalidConfig)
	case c.CheckPeriod < 0 || c.ExitAfter < 0:
		return fmt.Errorf("%w: negative CheckPeriod or ExitAfter", ErrInvalidConfig)
	}
	if c.CheckPeriod == 0 {
		c.CheckPeriod = 10 * time.Second
	}
	if c.ExitAfter == 0 {
		c.ExitAfter = 5 * time.Minute
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return nil
}

// NewClient prepares the kubelet's API client configuration. Without rotation and
// with a bootstrap kubeconfig it first bootstraps when needed (see NeedsBootstrap),
// blocking until the CSR is approved and signed or ctx ends. With rotation it
// writes the kubeconfig pointing at the certificate directory when needed and
// builds the certificate manager; Run starts it and WaitForCertificate waits for
// the first certificate.
func NewClient(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !cfg.Rotate {
		if cfg.BootstrapKubeconfig != "" {
			if err := bootstrapClientCert(ctx, cfg); err != nil {
				return nil, err
			}
		}
		rc, err := loadKubeconfig(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		return &Client{cfg: cfg, rest: rc}, nil
	}
	return newRotatingClient(ctx, cfg)
}

// RESTConfig is the configuration the kubelet's API clients are built from. With
// rotation it carries its own transport, which presents the manager's current
// certificate.
func (c *Client) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Current is the client certificate in use with rotation, nil otherwise or when
// none is valid yet.
func (c *Client) Current() *tls.Certificate {
	if c.manager == nil {
		return nil
	}
	return c.manager.Current()
}

// WaitForCertificate returns once the client has a valid certificate (at once
// without rotation) or with ctx's error.
func (c *Client) WaitForCertificate(ctx context.Context) error {
	if c.manager == nil {
		return nil
	}
	t := c.cfg.Clock.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for c.manager.Current() == nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a client certificate for node %s: %w", c.cfg.NodeName, ctx.Err())
		case <-t.C():
		}
	}
	return nil
}

// Run starts the certificate manager (with rotation) and, every CheckPeriod, closes
// the API client's connections when the manager's certificate has changed. It
// returns nil when ctx ends, having stopped the manager, or ErrNoClientCertificate
// (see Config.ExitAfter). Without rotation it only waits for ctx.
func (c *Client) Run(ctx context.Context) error {
	if c.manager == nil {
		<-ctx.Done()
		return nil
	}
	log := logr.FromContextOrDiscard(ctx)
	log.V(2).Info("Starting client certificate rotation")
	c.manager.Start()
	defer c.manager.Stop()
	t := c.cfg.Clock.NewTicker(c.cfg.CheckPeriod)
	defer t.Stop()
	last := c.manager.Current()
	lastValid := c.cfg.Clock.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		cur := c.manager.Current()
		now := c.cfg.Clock.Now()
		if cur != nil {
			lastValid = now
		} else if now.Sub(lastValid) > c.cfg.ExitAfter {
			if c.manager.ServerHealthy() {
				return fmt.Errorf("%w for node %s for %s while the API server is responsive", ErrNoClientCertificate, c.cfg.NodeName, c.cfg.ExitAfter)
			}
			log.Info("No valid client certificate and the API server is not responsive; a restart may be necessary to retrieve new initial credentials", "since", lastValid)
		}
		if cur == nil || cur == last {
			continue
		}
		last = cur
		log.Info("Certificate rotation detected, shutting down client connections to start using new credentials")
		c.dialer.CloseAll()
	}
}

// newRotatingClient is upstream's LoadClientConfig plus the client certificate
// manager and the transport that follows it.
func newRotatingClient(ctx context.Context, cfg Config) (*Client, error) {
	log := logr.FromContextOrDiscard(ctx)
	certConfig, userConfig, err := rotationConfigs(ctx, cfg)
	if err != nil {
		return nil, err
	}
	store, err := certificate.NewFileStore(clientPairPrefix, cfg.CertDir, cfg.CertDir, userConfig.CertFile, userConfig.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate store in %s: %w", cfg.CertDir, err)
	}
	c := &Client{cfg: cfg}
	newClientset := func(current *tls.Certificate) (kubernetes.Interface, error) {
		// The bootstrap credentials only while there is no valid certificate;
		// renewals are requested as the node itself, as upstream.
		if current == nil {
			return kubernetes.NewForConfig(certConfig)
		}
		return kubernetes.NewForConfig(c.rest)
	}
	mctx := logr.NewContext(context.Background(), log.WithName("client-certificate"))
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: newClientset,
		Template: &x509.CertificateRequest{Subject: pkix.Name{
			CommonName:   "system:node:" + cfg.NodeName,
			Organization: []string{"system:nodes"},
		}},
		SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
		GetUsages:  certificate.DefaultKubeletClientGetUsages,
		// A kubeconfig with an embedded certificate (kubeadm's on control-plane
		// nodes) seeds the store and is rotated out at once, as upstream.
		BootstrapCertificatePEM: userConfig.CertData,
		BootstrapKeyPEM:         userConfig.KeyData,
		CertificateStore:        store,
		CertificateRenewFailure: cfg.RenewFailures,
		Ctx:                     &mctx,
	})
	if err != nil {
		return nil, fmt.Errorf("client certificate manager: %w", err)
	}
	c.manager = m
	c.dialer = connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	// client-go's hook for a client certificate that changes: the transport calls
	// GetCert at every handshake. Run closes the connections when it changes.
	tc := &transport.Config{
		TLS: transport.TLSConfig{
			Insecure:   userConfig.Insecure,
			ServerName: userConfig.ServerName,
			CAFile:     userConfig.CAFile,
			CAData:     userConfig.CAData,
			NextProtos: userConfig.NextProtos,
			GetCertHolder: &transport.GetCertHolder{GetCert: func() (*tls.Certificate, error) {
				return m.Current(), nil
			}},
		},
		DialHolder: &transport.DialHolder{Dial: c.dialer.DialContext},
		Proxy:      userConfig.Proxy,
	}
	rt, err := transport.New(tc)
	if err != nil {
		return nil, fmt.Errorf("client transport for %s: %w", cfg.Kubeconfig, err)
	}
	rc := rest.AnonymousClientConfig(userConfig)
	rc.TLSClientConfig = rest.TLSClientConfig{}
	rc.Proxy = nil
	rc.Transport = rt
	c.rest = rc
	return c, nil
}

// rotationConfigs returns the configuration certificates are requested with while
// there is none (certConfig) and the one the kubelet uses (userConfig), writing the
// kubeconfig to point at the certificate directory when bootstrapping.
func rotationConfigs(ctx context.Context, cfg Config) (certConfig, userConfig *rest.Config, err error) {
	log := logr.FromContextOrDiscard(ctx)
	if cfg.BootstrapKubeconfig == "" {
		rc, err := loadKubeconfig(cfg.Kubeconfig)
		if err != nil {
			return nil, nil, err
		}
		log.V(2).Info("No bootstrapping requested, will use kubeconfig")
		return rc, rest.CopyConfig(rc), nil
	}
	needed, err := NeedsBootstrap(ctx, cfg.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	if !needed {
		rc, err := loadKubeconfig(cfg.Kubeconfig)
		if err != nil {
			return nil, nil, err
		}
		log.V(2).Info("Current kubeconfig file contents are still valid, no bootstrap necessary")
		return rc, rest.CopyConfig(rc), nil
	}
	bc, err := loadBootstrapKubeconfig(cfg.BootstrapKubeconfig)
	if err != nil {
		return nil, nil, err
	}
	pemPath := filepath.Join(cfg.CertDir, clientPairPrefix+"-current.pem")
	uc := rest.AnonymousClientConfig(bc)
	uc.CertFile, uc.KeyFile = pemPath, pemPath
	if err := WriteKubeconfig(bc, cfg.Kubeconfig, pemPath); err != nil {
		return nil, nil, err
	}
	log.V(2).Info("Use the bootstrap credentials to request a cert, and set kubeconfig to point to the certificate dir")
	return bc, uc, nil
}

// bootstrapClientCert is upstream's LoadClientCert: a one-shot bootstrap when the
// kubeconfig is not usable.
func bootstrapClientCert(ctx context.Context, cfg Config) error {
	log := logr.FromContextOrDiscard(ctx)
	needed, err := NeedsBootstrap(ctx, cfg.Kubeconfig)
	if err != nil {
		return err
	}
	if !needed {
		log.V(2).Info("Kubeconfig exists and is valid, skipping bootstrap", "path", cfg.Kubeconfig)
		return nil
	}
	log.V(2).Info("Using bootstrap kubeconfig to generate TLS client cert, key and kubeconfig file")
	bc, err := loadBootstrapKubeconfig(cfg.BootstrapKubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(bc)
	if err != nil {
		return fmt.Errorf("unable to create certificates signing request client: %w", err)
	}
	store, err := certificate.NewFileStore(clientPairPrefix, cfg.CertDir, cfg.CertDir, "", "")
	if err != nil {
		return fmt.Errorf("client certificate store in %s: %w", cfg.CertDir, err)
	}
	// Reuse the key of an expired pair, or the one kept from an attempt that did not
	// finish, so a restart does not leave a trail of CSRs with different keys.
	var keyData []byte
	if cur, err := store.Current(); err == nil && cur.PrivateKey != nil {
		if kd, err := keyutil.MarshalPrivateKeyToPEM(cur.PrivateKey); err == nil {
			keyData = kd
		}
	}
	keyPath := filepath.Join(cfg.CertDir, tmpPrivateKeyFile)
	if _, err := keyutil.ParsePrivateKeyPEM(keyData); len(keyData) == 0 || err != nil {
		if keyData, _, err = keyutil.LoadOrGenerateKeyFile(keyPath); err != nil {
			return fmt.Errorf("private key %s: %w", keyPath, err)
		}
	}
	if err := waitForServer(ctx, bc, time.Minute); err != nil {
		log.Info("Error waiting for apiserver to come up", "err", err)
	}
	certData, err := requestNodeCertificate(ctx, client, keyData, cfg.NodeName)
	if err != nil {
		return err
	}
	if _, err := store.Update(certData, keyData); err != nil {
		return fmt.Errorf("store the client certificate in %s: %w", cfg.CertDir, err)
	}
	if err := os.Remove(keyPath); err != nil && !os.IsNotExist(err) {
		log.V(2).Info("Failed cleaning up private key file", "path", keyPath, "err", err)
	}
	return WriteKubeconfig(bc, cfg.Kubeconfig, store.CurrentPath())
}

// NeedsBootstrap reports whether the kubeconfig at path must be (re)made from the
// bootstrap kubeconfig: it does not exist, cannot be loaded, has no client
// certificate, or one of its certificates has expired. Only an error other than
// "does not exist" reading the file is returned as an error.
func NeedsBootstrap(ctx context.Context, path string) (bool, error) {
	log := logr.FromContextOrDiscard(ctx)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("error reading existing bootstrap kubeconfig %s: %w", path, err)
	}
	rc, err := loadKubeconfig(path)
	if err != nil {
		log.Info("Unable to read existing kubeconfig; bootstrapping", "path", path, "err", err)
		return true, nil
	}
	tc, err := rc.TransportConfig()
	if err != nil {
		log.Info("Unable to load transport configuration from existing kubeconfig; bootstrapping", "path", path, "err", err)
		return true, nil
	}
	// Reads the certificate and key files into the transport configuration.
	if _, err := transport.TLSConfigFor(tc); err != nil {
		log.Info("Unable to load TLS configuration from existing kubeconfig; bootstrapping", "path", path, "err", err)
		return true, nil
	}
	certs, err := certutil.ParseCertsPEM(tc.TLS.CertData)
	if err != nil || len(certs) == 0 {
		log.Info("Unable to read TLS certificates from existing kubeconfig; bootstrapping", "path", path, "err", err)
		return true, nil
	}
	now := time.Now()
	for _, c := range certs {
		if now.After(c.NotAfter) {
			log.Info("Part of the existing client certificate is expired; bootstrapping", "path", path, "notAfter", c.NotAfter)
			return true, nil
		}
	}
	return false, nil
}

// WriteKubeconfig writes the kubeconfig a bootstrap leaves at path: the bootstrap
// kubeconfig's server and CA (its file, or else its data), and pemPath as client
// certificate and key, under the names upstream uses.
func WriteKubeconfig(bootstrap *rest.Config, path, pemPath string) error {
	caFile, caData := bootstrap.CAFile, []byte(nil)
	if caFile == "" {
		caData = bootstrap.CAData
	}
	kc := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{"default-cluster": {
			Server:                   bootstrap.Host,
			InsecureSkipTLSVerify:    bootstrap.Insecure,
			CertificateAuthority:     caFile,
			CertificateAuthorityData: caData,
		}},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{"default-auth": {
			ClientCertificate: pemPath,
			ClientKey:         pemPath,
		}},
		Contexts: map[string]*clientcmdapi.Context{"default-context": {
			Cluster:   "default-cluster",
			AuthInfo:  "default-auth",
			Namespace: "default",
		}},
		CurrentContext: "default-context",
	}
	if err := clientcmd.WriteToFile(kc, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

func loadKubeconfig(path string) (*rest.Config, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
	loaded, err := rules.Load()
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidKubeconfig, path, err)
	}
	rc, err := clientcmd.NewNonInteractiveClientConfig(*loaded, loaded.CurrentContext, &clientcmd.ConfigOverrides{}, rules).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidKubeconfig, path, err)
	}
	return rc, nil
}

func loadBootstrapKubeconfig(path string) (*rest.Config, error) {
	rc, err := loadKubeconfig(path)
	if err != nil {
		return nil, fmt.Errorf("unable to load bootstrap kubeconfig: %w", err)
	}
	return rc, nil
}

// waitForServer polls the API server's /healthz with the bootstrap credentials
// for up to deadline, as upstream does before the first CSR.
func waitForServer(ctx context.Context, cfg *rest.Config, deadline time.Duration) error {
	c := rest.CopyConfig(cfg)
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	c.Timeout = time.Second
	cli, err := rest.UnversionedRESTClientFor(c)
	if err != nil {
		return fmt.Errorf("couldn't create client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	log := logr.FromContextOrDiscard(ctx)
	connected := false
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		if _, err := cli.Get().AbsPath("/healthz").Do(ctx).Raw(); err != nil {
			log.Info("Failed to connect to apiserver", "err", err)
			return
		}
		connected = true
		cancel()
	}, 2*time.Second, 0.2, true)
	if !connected {
		return errors.New("timed out waiting to connect to apiserver")
	}
	return nil
}

// requestNodeCertificate creates the node's client CSR with the bootstrap client and
// waits (at most an hour, as upstream) for the signed certificate.
func requestNodeCertificate(ctx context.Context, client kubernetes.Interface, keyData []byte, nodeName string) ([]byte, error) {
	subject := &pkix.Name{CommonName: "system:node:" + nodeName, Organization: []string{"system:nodes"}}
	key, err := keyutil.ParsePrivateKeyPEM(keyData)
	if err != nil {
		return nil, fmt.Errorf("invalid private key for certificate request: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("private key does not implement crypto.Signer")
	}
	csrData, err := certutil.MakeCSR(key, subject, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("unable to generate certificate request: %w", err)
	}
	usages := certificate.DefaultKubeletClientGetUsages(key)
	name, err := digestedName(signer.Public(), subject, usages)
	if err != nil {
		return nil, err
	}
	reqName, reqUID, err := csr.RequestCertificateWithContext(ctx, client, csrData, name, certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate signing request %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	logr.FromContextOrDiscard(ctx).V(2).Info("Waiting for client certificate to be issued", "csr", reqName)
	cert, err := csr.WaitForCertificate(ctx, client, reqName, reqUID)
	if err != nil {
		return nil, fmt.Errorf("certificate signing request %s: %w", reqName, err)
	}
	return cert, nil
}

// digestedName names the bootstrap CSR after what it asks for (public key, subject,
// usages), node-csr-<digest> as upstream, so a retried request finds the earlier one.
func digestedName(pub crypto.PublicKey, subject *pkix.Name, usages []certificatesv1.KeyUsage) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("marshal the public key: %w", err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	h := sha512.New512_256()
	// '|' is outside the base64url alphabet, so fields cannot run into each other.
	add := func(b []byte) { h.Write([]byte(enc(b))); h.Write([]byte{'|'}) }
	add(der)
	add([]byte(subject.CommonName))
	for _, o := range subject.Organization {
		add([]byte(o))
	}
	for _, u := range usages {
		add([]byte(u))
	}
	return "node-csr-" + enc(h.Sum(nil)), nil
}
