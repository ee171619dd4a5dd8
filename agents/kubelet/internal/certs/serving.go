package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"sort"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate"
)

// ErrNoServingCertificate is returned by Serving.GetCertificate until the serving
// CSR has been approved and signed.
var ErrNoServingCertificate = errors.New("no serving certificate available for the kubelet")

// ServingConfig says what serving certificate to request (serverTLSBootstrap).
type ServingConfig struct {
	// NodeName is the node's name: the certificate is for system:node:NodeName.
	// Required.
	NodeName string
	// Client creates and watches the CSRs, as the node. Required.
	Client kubernetes.Interface
	// Hostnames and IPs are the subject alternative names (the node's hostname and
	// addresses). At least one IP is required, as upstream requires before it asks.
	Hostnames []string
	IPs       []net.IP
	// CertDir is --cert-dir, where kubelet-server-*.pem are kept. Required.
	CertDir string
	// TLSCertFile and TLSPrivateKeyFile (KubeletConfiguration) seed the store when
	// it is empty, as upstream; both empty means none.
	TLSCertFile, TLSPrivateKeyFile string
	// RenewFailures counts failed renewals (kubelet_server_expiration_renew_errors)
	// and Rotations the age of certificates when replaced
	// (kubelet_certificate_manager_server_rotation_seconds). Nil: not recorded.
	RenewFailures certificate.Counter
	Rotations     certificate.Histogram
}

// Serving keeps the kubelet's serving certificate, requested through a CSR and
// renewed before it expires.
type Serving struct {
	manager certificate.Manager
}

// NewServing builds the serving certificate manager; Run starts it.
func NewServing(ctx context.Context, cfg ServingConfig) (*Serving, error) {
	switch {
	case cfg.NodeName == "":
		return nil, fmt.Errorf("%w: the node name is empty", ErrInvalidConfig)
	case cfg.Client == nil:
		return nil, fmt.Errorf("%w: serverTLSBootstrap needs an API client", ErrInvalidConfig)
	case cfg.CertDir == "":
		return nil, fmt.Errorf("%w: --cert-dir is empty", ErrInvalidConfig)
	case len(cfg.IPs) == 0:
		return nil, fmt.Errorf("%w: no IP address for node %s to put in its serving certificate", ErrInvalidConfig, cfg.NodeName)
	}
	store, err := certificate.NewFileStore(servingPairPrefix, cfg.CertDir, cfg.CertDir, cfg.TLSCertFile, cfg.TLSPrivateKeyFile)
	if err != nil {
		return nil, fmt.Errorf("failed to initialize server certificate store in %s: %w", cfg.CertDir, err)
	}
	hostnames, ips := dedupSANs(cfg.Hostnames, cfg.IPs)
	client := cfg.Client
	mctx := logr.NewContext(context.Background(), logr.FromContextOrDiscard(ctx).WithName("serving-certificate"))
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kubernetes.Interface, error) { return client, nil },
		Template: &x509.CertificateRequest{
			Subject: pkix.Name{
				CommonName:   "system:node:" + cfg.NodeName,
				Organization: []string{"system:nodes"},
			},
			DNSNames:    hostnames,
			IPAddresses: ips,
		},
		SignerName:              certificatesv1.KubeletServingSignerName,
		GetUsages:               certificate.DefaultKubeletServingGetUsages,
		CertificateStore:        store,
		CertificateRotation:     cfg.Rotations,
		CertificateRenewFailure: cfg.RenewFailures,
		Ctx:                     &mctx,
	})
	if err != nil {
		return nil, fmt.Errorf("failed to initialize server certificate manager: %w", err)
	}
	return &Serving{manager: m}, nil
}

// Run requests and renews the serving certificate until ctx ends.
func (s *Serving) Run(ctx context.Context) error {
	s.manager.Start()
	<-ctx.Done()
	s.manager.Stop()
	return nil
}

// Current is the serving certificate, nil until one is issued or when it expired.
func (s *Serving) Current() *tls.Certificate { return s.manager.Current() }

// GetCertificate is a tls.Config.GetCertificate that serves the current
// certificate, so a renewed one is used from the next handshake on.
func (s *Serving) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.manager.Current()
	if c == nil {
		return nil, ErrNoServingCertificate
	}
	return c, nil
}

// dedupSANs drops empty and repeated names and addresses, in a stable order; a
// "hostname" that is an IP address is put with the addresses, as upstream.
func dedupSANs(hostnames []string, ips []net.IP) ([]string, []net.IP) {
	names := map[string]bool{}
	addrs := map[string]net.IP{}
	for _, h := range hostnames {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			addrs[ip.String()] = ip
		} else {
			names[h] = true
		}
	}
	for _, ip := range ips {
		if ip != nil {
			addrs[ip.String()] = ip
		}
	}
	var outNames []string
	for n := range names {
		outNames = append(outNames, n)
	}
	sort.Strings(outNames)
	var keys []string
	for k := range addrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	outIPs := make([]net.IP, 0, len(keys))
	for _, k := range keys {
		outIPs = append(outIPs, addrs[k])
	}
	return outNames, outIPs
}
