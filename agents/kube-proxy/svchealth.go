package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
)

// serviceHealth is one IP family's health check servers, as upstream's
// pkg/proxy/healthcheck/service_health.go, of which each per-family proxier has
// one: an HTTP server per Service with a healthCheckNodePort (type LoadBalancer,
// externalTrafficPolicy Local) in that family, listening on the family's
// NodePort addresses (tcp4 on 0.0.0.0, or tcp6 on [::], when every address takes
// NodePorts). Load balancers ask it whether this node has a ready local endpoint
// of the family: 200 when it has one and the proxy is healthy, 503 otherwise,
// with upstream's JSON body and X-Load-Balancing-Endpoint-Weight.
type serviceHealth struct {
	family v1.IPFamily
	// nodeIPs are the addresses to listen on; empty means the family's
	// unspecified address.
	nodeIPs []netip.Addr
	// listen opens a listener where the node's network lives.
	listen  func(network, addr string) (net.Listener, error)
	healthy func() bool
	// recorder, when set, gets upstream's FailedToStartServiceHealthcheck
	// event, naming nodeName.
	recorder events.EventRecorder
	nodeName string

	mu       sync.RWMutex
	services map[types.NamespacedName]*hcInstance
}

type hcInstance struct {
	port      uint16
	servers   []*http.Server
	endpoints int
}

// newServiceHealth makes family's servers. A nil listen listens in the
// process's own network namespace.
func newServiceHealth(family v1.IPFamily, nodeIPs []netip.Addr, listen func(network, addr string) (net.Listener, error), healthy func() bool) *serviceHealth {
	if listen == nil {
		listen = net.Listen
	}
	return &serviceHealth{family: family, nodeIPs: nodeIPs, listen: listen, healthy: healthy, services: map[types.NamespacedName]*hcInstance{}}
}

// sync opens servers for new ports, closes those of services gone or moved,
// and records each service's local ready endpoint count.
func (s *serviceHealth) sync(logger klog.Logger, ports map[types.NamespacedName]uint16, local map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nn, inst := range s.services {
		if p, ok := ports[nn]; !ok || p != inst.port {
			logger.V(2).Info("Closing healthcheck", "service", nn, "port", inst.port)
			inst.close()
			delete(s.services, nn)
		}
	}
	for nn, port := range ports {
		if s.services[nn] != nil {
			continue
		}
		logger.V(2).Info("Opening healthcheck", "service", nn, "port", port)
		inst, err := s.open(logger, nn, port)
		if err != nil {
			if s.recorder != nil {
				s.recorder.Eventf(&v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: nn.Namespace, Name: nn.Name}, nil,
					v1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen",
					"node %s failed to start healthcheck %q on port %d: %v", s.nodeName, nn.String(), port, err)
			}
			logger.Error(err, "Failed to start healthcheck", "node", s.nodeName, "service", nn, "port", port)
			continue
		}
		s.services[nn] = inst
	}
	for nn, inst := range s.services {
		inst.endpoints = local[nn]
	}
}

func (s *serviceHealth) open(logger klog.Logger, nn types.NamespacedName, port uint16) (*hcInstance, error) {
	// tcp6 sets IPV6_V6ONLY, so the two families' servers share a port number.
	network, ips := "tcp4", []netip.Addr{netip.IPv4Unspecified()}
	if s.family == v1.IPv6Protocol {
		network, ips = "tcp6", []netip.Addr{netip.IPv6Unspecified()}
	}
	if len(s.nodeIPs) > 0 {
		ips = s.nodeIPs
	}
	inst := &hcInstance{port: port}
	for _, ip := range ips {
		ln, err := s.listen(network, netip.AddrPortFrom(ip, port).String())
		if err != nil {
			inst.close()
			return nil, err
		}
		srv := &http.Server{Handler: s.handler(nn), ReadHeaderTimeout: 10 * time.Second}
		inst.servers = append(inst.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Healthcheck closed", "service", nn)
			}
		}()
	}
	return inst, nil
}

func (inst *hcInstance) close() {
	for _, srv := range inst.servers {
		_ = srv.Close()
	}
}

// Close stops every server.
func (s *serviceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nn, inst := range s.services {
		inst.close()
		delete(s.services, nn)
	}
}

func (s *serviceHealth) handler(nn types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.RLock()
		inst, ok := s.services[nn]
		count := 0
		if ok {
			count = inst.endpoints
		}
		s.mu.RUnlock()
		if !ok {
			return
		}
		healthy := s.healthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count != 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		// Upstream's body, byte for byte: tab-indented, no trailing newline.
		fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
			nn.Namespace, nn.Name, count, healthy)
	})
}

// listenIn returns a listen function that opens sockets through do (on the
// node namespace's thread), so the servers answer on the node's addresses.
func listenIn(do func(func() error) error) func(network, addr string) (net.Listener, error) {
	return func(network, addr string) (net.Listener, error) {
		var ln net.Listener
		err := do(func() error {
			var err error
			ln, err = (&net.ListenConfig{}).Listen(context.Background(), network, addr)
			return err
		})
		return ln, err
	}
}
