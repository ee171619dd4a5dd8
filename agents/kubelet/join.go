package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/certs"
)

// The certificate managers' metrics, under the upstream kubelet's names.
var (
	clientRenewErrors = metrics.NewCounter(&metrics.CounterOpts{
		Namespace: "kubelet", Subsystem: "certificate_manager", Name: "client_expiration_renew_errors",
		Help:           "Counter of certificate renewal errors.",
		StabilityLevel: metrics.ALPHA,
	})
	serverRenewErrors = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "kubelet", Name: "server_expiration_renew_errors",
		Help:           "Counter of certificate renewal errors.",
		StabilityLevel: metrics.ALPHA,
	})
	serverRotationSeconds = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: "kubelet", Name: "certificate_manager_server_rotation_seconds",
		Help:           "Histogram of the number of seconds the previous certificate lived before being rotated.",
		Buckets:        []float64{60, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000, 124416000},
		StabilityLevel: metrics.ALPHA,
	})
	certMetricsOnce sync.Once
)

// ttlSeconds is a certificate's remaining life for the *_ttl_seconds gauges: +Inf
// when there is none.
func ttlSeconds(current func() *time.Time) float64 {
	if t := current(); t != nil {
		return math.Trunc(time.Until(*t).Seconds())
	}
	return math.Inf(1)
}

func registerCertMetrics(client *certs.Client, serving *certs.Serving) {
	certMetricsOnce.Do(func() {
		legacyregistry.MustRegister(clientRenewErrors, serverRenewErrors, serverRotationSeconds)
		notAfter := func(get func() *time.Time) func() float64 { return func() float64 { return ttlSeconds(get) } }
		legacyregistry.RawMustRegister(metrics.NewGaugeFunc(&metrics.GaugeOpts{
			Subsystem: "kubelet", Name: "certificate_manager_client_ttl_seconds",
			Help:           "Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.",
			StabilityLevel: metrics.ALPHA,
		}, notAfter(func() *time.Time {
			if c := client.Current(); c != nil && c.Leaf != nil {
				return &c.Leaf.NotAfter
			}
			return nil
		})))
		if serving != nil {
			legacyregistry.RawMustRegister(metrics.NewGaugeFunc(&metrics.GaugeOpts{
				Subsystem: "kubelet", Name: "certificate_manager_server_ttl_seconds",
				Help:           "Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.",
				StabilityLevel: metrics.ALPHA,
			}, notAfter(func() *time.Time {
				if c := serving.Current(); c != nil && c.Leaf != nil {
					return &c.Leaf.NotAfter
				}
				return nil
			})))
		}
	})
}

// credentials are what joining the cluster gives the kubelet.
type credentials struct {
	// rest is the API client configuration (its transport follows client
	// certificate rotation).
	rest *rest.Config
	// serving keeps the serving certificate requested through a CSR
	// (serverTLSBootstrap); nil otherwise. Its GetCertificate is the HTTPS server's
	// tls.Config.GetCertificate.
	serving *certs.Serving
	// stop stops the certificate managers and waits for them.
	stop func()
}

// defaultCertDir is --cert-dir's default, upstream's: it does not follow --root-dir.
const defaultCertDir = "/var/lib/kubelet/pki"

// certDir is --cert-dir.
func certDir(o *options) string { return o.certDir }

// joinCluster gets the kubelet's API credentials from --kubeconfig, first
// bootstrapping them with --bootstrap-kubeconfig when needed, keeps the client
// certificate rotated (rotateCertificates) and requests the serving certificate
// (serverTLSBootstrap). It blocks until there is a client certificate or ctx ends.
func joinCluster(ctx context.Context, o *options, cfg *kubeletv1beta1.KubeletConfiguration, nodeName, hostname string, nodeIP net.IP) (*credentials, error) {
	dir := certDir(o)
	client, err := certs.NewClient(ctx, certs.Config{
		NodeName: nodeName, Kubeconfig: o.kubeconfig, BootstrapKubeconfig: o.bootstrapKubeconfig,
		CertDir: dir, Rotate: cfg.RotateCertificates, RenewFailures: clientRenewErrors,
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() { cancel(); wg.Wait() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := client.Run(runCtx); err != nil {
			// As upstream: exit, so the supervisor restarts the kubelet and it can
			// bootstrap again.
			klog.ErrorS(err, "Exiting")
			klog.Flush()
			os.Exit(1)
		}
	}()
	if err := client.WaitForCertificate(ctx); err != nil {
		stop()
		return nil, err
	}
	creds := &credentials{rest: client.RESTConfig(), stop: stop}
	if cfg.ServerTLSBootstrap {
		cs, err := kubernetes.NewForConfig(creds.rest)
		if err != nil {
			stop()
			return nil, fmt.Errorf("kubernetes client for the serving certificate: %w", err)
		}
		creds.serving, err = certs.NewServing(ctx, certs.ServingConfig{
			NodeName: nodeName, Client: cs, Hostnames: []string{hostname}, IPs: []net.IP{nodeIP},
			CertDir: dir, TLSCertFile: cfg.TLSCertFile, TLSPrivateKeyFile: cfg.TLSPrivateKeyFile,
			RenewFailures: serverRenewErrors, Rotations: serverRotationSeconds,
		})
		if err != nil {
			stop()
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = creds.serving.Run(runCtx) }()
	}
	registerCertMetrics(client, creds.serving)
	return creds, nil
}
