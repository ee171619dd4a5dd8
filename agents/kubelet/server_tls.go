package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"sync/atomic"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// servingTLS is the :10250 server's TLS configuration and what keeps it current.
type servingTLS struct {
	config *tls.Config
	// certFile and keyFile are the serving certificate's files ("" with GetCertificate).
	certFile, keyFile string
	// run watches the certificate files and the client CA (nil when there is nothing to watch).
	run func(ctx context.Context)
}

// buildServingTLS makes the serving TLS configuration as the kubelet does
// (cmd/kubelet/app.InitializeTLS and NewMainKubelet):
//
//   - getCert, when not nil, supplies the certificate (TLS bootstrap or rotation);
//   - otherwise tlsCertFile and tlsPrivateKeyFile, reloaded when they change
//     (ReloadKubeletServerCertificateFile);
//   - when neither file is set, a self-signed certificate for hostname is made once
//     and kept as kubelet.crt and kubelet.key in certDir, then used like the files.
//
// tlsCipherSuites and tlsMinVersion are honoured (names as --tls-cipher-suites and
// --tls-min-version take them). With a client CA the handshake asks for, but does
// not require, a client certificate (tls.RequestClientCert): the authenticator
// verifies it, so a request without one still reaches the 401 (or the anonymous
// user). The CA is reloaded when its file changes (ReloadKubeletClientCAFile).
func buildServingTLS(c *kubeletv1beta1.KubeletConfiguration, certDir, hostname string,
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCA dynamiccertificates.CAContentProvider) (*servingTLS, error) {
	suites, err := cliflag.TLSCipherSuites(c.TLSCipherSuites)
	if err != nil {
		return nil, err
	}
	if len(suites) > 0 {
		insecure := cliflag.InsecureTLSCiphers()
		for _, id := range suites {
			for name, insecureID := range insecure {
				if id == insecureID {
					klog.InfoS("Use of insecure cipher detected.", "cipher", name)
				}
			}
		}
	}
	minVersion, err := cliflag.TLSVersion(c.TLSMinVersion)
	if err != nil {
		return nil, err
	}
	if minVersion == tls.VersionTLS13 && len(suites) != 0 {
		klog.InfoS("Warning: TLS 1.3 cipher suites are not configurable, ignoring --tls-cipher-suites")
	}
	out := &servingTLS{config: &tls.Config{MinVersion: minVersion, CipherSuites: suites}}
	var runs []func(context.Context)

	if getCert != nil {
		out.config.GetCertificate = getCert
	} else {
		certFile, keyFile := c.TLSCertFile, c.TLSPrivateKeyFile
		if certFile == "" && keyFile == "" {
			certFile, keyFile = filepath.Join(certDir, "kubelet.crt"), filepath.Join(certDir, "kubelet.key")
			if err := ensureSelfSigned(certFile, keyFile, hostname); err != nil {
				return nil, err
			}
		}
		if certFile == "" || keyFile == "" {
			return nil, fmt.Errorf("tlsCertFile and tlsPrivateKeyFile must be set together (tlsCertFile %q, tlsPrivateKeyFile %q)", certFile, keyFile)
		}
		files, err := newCertFiles(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		out.certFile, out.keyFile = certFile, keyFile
		out.config.GetCertificate = files.get
		runs = append(runs, func(ctx context.Context) { files.content.Run(ctx, 1) })
	}

	if c.Authentication.X509.ClientCAFile != "" {
		// Populate PeerCertificates, but do not reject connections without a verified one.
		out.config.ClientAuth = tls.RequestClientCert
		ctl := dynamiccertificates.NewDynamicServingCertificateController(out.config.Clone(), clientCA, nil, nil, nil)
		if err := ctl.RunOnce(); err != nil {
			return nil, fmt.Errorf("unable to load client CA file %s: %w", c.Authentication.X509.ClientCAFile, err)
		}
		clientCA.AddListener(ctl)
		out.config.GetConfigForClient = ctl.GetConfigForClient
		runs = append(runs, func(ctx context.Context) { ctl.Run(1, ctx.Done()) })
	}
	if len(runs) > 0 {
		out.run = func(ctx context.Context) {
			for _, r := range runs {
				go r(ctx)
			}
		}
	}
	return out, nil
}

// ensureSelfSigned writes a self-signed certificate and key for host unless both
// files are readable already (certutil.GenerateSelfSignedCertKey, as the kubelet).
func ensureSelfSigned(certFile, keyFile, host string) error {
	ok, err := certutil.CanReadCertAndKey(certFile, keyFile)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	cert, key, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		return fmt.Errorf("unable to generate self signed cert: %w", err)
	}
	if err := certutil.WriteCert(certFile, cert); err != nil {
		return err
	}
	if err := keyutil.WriteKey(keyFile, key); err != nil {
		return err
	}
	klog.V(4).InfoS("Using self-signed cert", "TLSCertFile", certFile, "TLSPrivateKeyFile", keyFile)
	return nil
}

// certFiles is the kubelet's dynamic file certificate manager: the last valid pair
// read from the files, replaced when they change.
type certFiles struct {
	content           *dynamiccertificates.DynamicCertKeyPairContent
	certFile, keyFile string
	current           atomic.Pointer[tls.Certificate]
}

func newCertFiles(certFile, keyFile string) (*certFiles, error) {
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("kubelet-server-cert-files", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("unable to set up dynamic certificate manager for kubelet server cert files: %w", err)
	}
	f := &certFiles{content: content, certFile: certFile, keyFile: keyFile}
	f.Enqueue()
	if f.current.Load() == nil {
		return nil, fmt.Errorf("invalid certificate and key pair in %s and %s", certFile, keyFile)
	}
	content.AddListener(f)
	return f, nil
}

// Enqueue is dynamiccertificates.Listener: the files changed.
func (f *certFiles) Enqueue() {
	certPEM, keyPEM := f.content.CurrentCertKeyContent()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		klog.ErrorS(err, "invalid certificate and key pair from file", "certFile", f.certFile, "keyFile", f.keyFile)
		return
	}
	f.current.Store(&cert)
	klog.V(4).InfoS("loaded certificate and key pair in kubelet server certificate manager", "certFile", f.certFile, "keyFile", f.keyFile)
}

func (f *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert := f.current.Load()
	if cert == nil {
		return nil, fmt.Errorf("no serving certificate available for the kubelet")
	}
	return cert, nil
}
