package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/nodekit-dev/nodekit/cri"
)

// ServerConfig is what the kubelet's HTTPS API server (address:port, 0.0.0.0:10250
// by default) is built from. docs/kubelet.md ("The kubelet API") says what it serves.
type ServerConfig struct {
	// NodeName is the node's name: the name in every authorization check.
	NodeName string
	// Hostname is the name the self-signed serving certificate is made for.
	Hostname string
	// CertDir holds the self-signed kubelet.crt and kubelet.key (--cert-dir).
	CertDir string
	// Config is the kubelet's effective configuration: address, port, TLS, authentication,
	// authorization and enableDebuggingHandlers are read from it; /configz serves it.
	Config *kubeletv1beta1.KubeletConfiguration
	// Client is the kubelet's API client, for TokenReview and SubjectAccessReview;
	// nil in standalone mode.
	Client kubernetes.Interface
	// Pods are the pods the kubelet runs.
	Pods serverPods
	// Runtime is the CRI runtime: container logs, exec, attach, port-forward, run.
	Runtime *cri.Client
	// Health serves /healthz.
	Health http.Handler

	// Stats, when not nil, is mounted at /stats/ (the summary API), authorized as the
	// nodes/stats subresource.
	Stats http.Handler
	// ResourceMetrics, when not nil, is mounted at /metrics/resource, authorized as
	// nodes/metrics.
	ResourceMetrics http.Handler
	// GetCertificate, when not nil, supplies the serving certificate (TLS bootstrap and
	// rotation) instead of tlsCertFile/tlsPrivateKeyFile or the self-signed one.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)

	// auth replaces the authenticator and authorizer built from Config (tests).
	auth *serverAuth
	// limits replaces kubeletLimits (tests, to reach the timeouts quickly).
	limits *httpLimits
}

// httpLimits are the bounds the HTTP server puts on every connection.
type httpLimits struct {
	// ReadTimeout bounds reading a whole request; with no ReadHeaderTimeout, net/http
	// also bounds the request headers with it, and the TLS handshake with the smallest
	// of ReadTimeout and WriteTimeout.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection waiting for its next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes: larger request headers are a 431 and the connection is closed.
	MaxHeaderBytes int
}

// kubeletLimits are the kubelet's (ListenAndServeKubeletServer): no ReadHeaderTimeout
// (unlike the API server's 32s), so headers and handshakes are bounded by the 4h
// ReadTimeout that long-running streams need.
var kubeletLimits = httpLimits{
	IdleTimeout:    90 * time.Second,
	ReadTimeout:    4 * 60 * time.Minute,
	WriteTimeout:   4 * 60 * time.Minute,
	MaxHeaderBytes: 1 << 20,
}

// serverPods is the kubelet's view of its pods that the API server reads.
type serverPods interface {
	// serverPodList returns the pods the kubelet runs, static pods with the status
	// the kubelet computed for them.
	serverPodList() []*corev1.Pod
	// serverPod returns the pod named namespace/name and the latest status the
	// kubelet computed for it (nil before its first sync).
	serverPod(namespace, name string) (*corev1.Pod, *corev1.PodStatus, bool)
}

// kubeletServer is the kubelet API server.
type kubeletServer struct {
	cfg     ServerConfig
	auth    *serverAuth
	tls     *servingTLS
	handler http.Handler
	configz []byte

	mu  sync.Mutex
	srv *http.Server
}

// newKubeletServer builds the server: authentication and authorization, TLS and the
// handlers. It fails, as the kubelet does at start, on a webhook without a client, an
// unreadable client CA or certificate, or an unknown cipher suite or TLS version.
func newKubeletServer(cfg ServerConfig) (*kubeletServer, error) {
	s := &kubeletServer{cfg: cfg, auth: cfg.auth}
	if s.auth == nil {
		a, err := buildAuth(cfg.Client, cfg.Config)
		if err != nil {
			return nil, err
		}
		s.auth = a
	}
	cz, err := configzJSON(cfg.Config)
	if err != nil {
		return nil, err
	}
	s.configz = cz
	s.handler = withAuth(cfg.NodeName, s.auth, s.mux())
	return s, nil
}

// configzJSON is what /configz serves: {"kubeletconfig": <KubeletConfiguration v1beta1>},
// as component-base's configz handler writes the kubelet's registered config.
func configzJSON(c *kubeletv1beta1.KubeletConfiguration) ([]byte, error) {
	v := c.DeepCopy()
	v.APIVersion = kubeletv1beta1.SchemeGroupVersion.String()
	v.Kind = "KubeletConfiguration"
	b, err := json.Marshal(map[string]any{"kubeletconfig": v})
	if err != nil {
		return nil, fmt.Errorf("error marshaling json: %w", err)
	}
	return b, nil
}

// Handler is the server's handler, authentication and authorization included.
func (s *kubeletServer) Handler() http.Handler { return s.handler }

func (s *kubeletServer) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.Handle(healthzPath, s.cfg.Health)
	m.HandleFunc(podsPath, getOnly(s.getPods))
	m.Handle(metricsPath, legacyregistry.Handler())
	if s.cfg.ResourceMetrics != nil {
		m.Handle(resourceMetricsPath, s.cfg.ResourceMetrics)
	}
	if s.cfg.Stats != nil {
		m.Handle(statsPath, s.cfg.Stats)
	}
	if s.cfg.Config.EnableDebuggingHandlers != nil && !*s.cfg.Config.EnableDebuggingHandlers {
		// The kubelet's InstallDebuggingDisabledHandlers.
		disabled := func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "Debug endpoints are disabled.", http.StatusMethodNotAllowed)
		}
		for _, p := range []string{"/run/", "/exec/", "/attach/", "/portForward/", "/containerLogs/", runningPodsPath, "/debug/pprof/", logsPath} {
			m.HandleFunc(p, disabled)
		}
		return m
	}
	m.HandleFunc(configzPath, s.getConfigz)
	s.installDebuggingHandlers(m)
	return m
}

// getOnly answers 405 with an Allow header to anything but GET, as the kubelet's
// GETOnlyRestfulFilter.
func getOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeErrorString(w, http.StatusMethodNotAllowed, "Method Not Allowed")
			return
		}
		h(w, r)
	}
}

// getPods serves /pods: the pods the kubelet runs, as a v1 PodList.
func (s *kubeletServer) getPods(w http.ResponseWriter, _ *http.Request) {
	list := &corev1.PodList{}
	for _, p := range s.cfg.Pods.serverPodList() {
		list.Items = append(list.Items, *p)
	}
	data, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), list)
	if err != nil {
		writeErrorString(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, data)
}

func (s *kubeletServer) getConfigz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(s.configz)
}

func writeJSON(w http.ResponseWriter, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(data); err != nil {
		klog.ErrorS(err, "Error writing response")
	}
}

// prepareTLS builds the serving TLS configuration (self-signing a certificate when
// needed). Start calls it when it has not run yet.
func (s *kubeletServer) prepareTLS() error {
	if s.tls != nil {
		return nil
	}
	t, err := buildServingTLS(s.cfg.Config, s.cfg.CertDir, s.cfg.Hostname, s.cfg.GetCertificate, s.auth.clientCA)
	if err != nil {
		return err
	}
	s.tls = t
	return nil
}

// Start listens on address:port and serves HTTPS until ctx ends or Close. It returns
// once the listener is open, with the address it listens on.
func (s *kubeletServer) Start(ctx context.Context) (net.Addr, error) {
	if err := s.prepareTLS(); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(s.cfg.Config.Address, strconv.Itoa(int(s.cfg.Config.Port)))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kubelet server: %w", err)
	}
	lim := kubeletLimits
	if s.cfg.limits != nil {
		lim = *s.cfg.limits
	}
	srv := &http.Server{ //nolint:gosec // no ReadHeaderTimeout, as the kubelet: ReadTimeout bounds headers
		Handler:        s.handler,
		IdleTimeout:    lim.IdleTimeout,
		ReadTimeout:    lim.ReadTimeout,
		WriteTimeout:   lim.WriteTimeout,
		MaxHeaderBytes: lim.MaxHeaderBytes,
		TLSConfig:      s.tls.config,
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	if s.auth.run != nil {
		go s.auth.run(ctx)
	}
	if s.tls.run != nil {
		s.tls.run(ctx)
	}
	klog.InfoS("Starting to listen", "address", s.cfg.Config.Address, "port", s.cfg.Config.Port)
	go func() {
		if err := srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Failed to listen and serve")
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return l.Addr(), nil
}

// Close stops the server and every open connection (streams included).
func (s *kubeletServer) Close() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}
