// Package servicemaptest builds Services and EndpointSlices for tests of code that
// uses package servicemap, and records Handler calls.
//
// Builders start from objects the way the API server stores them (a ClusterIP
// Service with defaulted protocol, session affinity None, traffic policies Cluster)
// and options change one field each:
//
//	svc := servicemaptest.Service("default", "web",
//		servicemaptest.ClusterIPs("10.96.0.10"),
//		servicemaptest.Port("http", 80, corev1.ProtocolTCP))
//	es := servicemaptest.EndpointSlice("default", "web-abc", "web", discoveryv1.AddressTypeIPv4,
//		servicemaptest.SlicePort("http", 8080, corev1.ProtocolTCP),
//		servicemaptest.Endpoints(servicemaptest.Endpoint("10.244.1.5", servicemaptest.OnNode("n1"))))
package servicemaptest

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }

// ServiceOption changes one aspect of a Service built by Service.
type ServiceOption func(*corev1.Service)

// Service returns a ClusterIP Service with API-server defaults and no ports.
func Service(namespace, name string, opts ...ServiceOption) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(namespace + "/" + name)},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			SessionAffinity:       corev1.ServiceAffinityNone,
			InternalTrafficPolicy: Ptr(corev1.ServiceInternalTrafficPolicyCluster),
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

// ClusterIPs sets spec.clusterIP, spec.clusterIPs and spec.ipFamilies from the
// addresses (the first is the primary). "None" makes the Service headless.
func ClusterIPs(ips ...string) ServiceOption {
	return func(s *corev1.Service) {
		s.Spec.ClusterIPs = append([]string(nil), ips...)
		s.Spec.IPFamilies = nil
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip); err == nil && a.Is6() {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, corev1.IPv6Protocol)
			} else if err == nil {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, corev1.IPv4Protocol)
			}
		}
	}
}

// Port adds a port (name may be empty for a single unnamed port).
func Port(name string, port int32, proto corev1.Protocol) ServiceOption {
	return func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: name, Port: port, Protocol: proto})
	}
}

// NodePort makes the Service type NodePort (unless it is LoadBalancer) and sets
// the node port of the named port.
func NodePort(portName string, nodePort int32) ServiceOption {
	return func(s *corev1.Service) {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			s.Spec.Type = corev1.ServiceTypeNodePort
		}
		if s.Spec.ExternalTrafficPolicy == "" {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		}
		for i := range s.Spec.Ports {
			if s.Spec.Ports[i].Name == portName {
				s.Spec.Ports[i].NodePort = nodePort
			}
		}
	}
}

// LoadBalancer makes the Service type LoadBalancer with the given VIP-mode ingress IPs.
func LoadBalancer(ingressIPs ...string) ServiceOption {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		if s.Spec.ExternalTrafficPolicy == "" {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		}
		for _, ip := range ingressIPs {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
	}
}

// ProxyIngress adds a load-balancer ingress IP in Proxy mode (not programmed by proxies).
func ProxyIngress(ip string) ServiceOption {
	return func(s *corev1.Service) {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress,
			corev1.LoadBalancerIngress{IP: ip, IPMode: Ptr(corev1.LoadBalancerIPModeProxy)})
	}
}

// SourceRanges sets spec.loadBalancerSourceRanges.
func SourceRanges(cidrs ...string) ServiceOption {
	return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = append([]string(nil), cidrs...) }
}

// ExternalIPs sets spec.externalIPs.
func ExternalIPs(ips ...string) ServiceOption {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = append([]string(nil), ips...) }
}

// ClientIPAffinity sets session affinity ClientIP; a nil timeout leaves
// sessionAffinityConfig unset (the API server would default it to 10800).
func ClientIPAffinity(timeoutSeconds *int32) ServiceOption {
	return func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = nil
		if timeoutSeconds != nil {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: timeoutSeconds}}
		}
	}
}

// ExternalTrafficPolicy sets spec.externalTrafficPolicy.
func ExternalTrafficPolicy(p corev1.ServiceExternalTrafficPolicy) ServiceOption {
	return func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = p }
}

// InternalTrafficPolicy sets spec.internalTrafficPolicy.
func InternalTrafficPolicy(p corev1.ServiceInternalTrafficPolicy) ServiceOption {
	return func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &p }
}

// HealthCheckNodePort sets spec.healthCheckNodePort.
func HealthCheckNodePort(p int32) ServiceOption {
	return func(s *corev1.Service) { s.Spec.HealthCheckNodePort = p }
}

// Type sets spec.type.
func Type(t corev1.ServiceType) ServiceOption {
	return func(s *corev1.Service) { s.Spec.Type = t }
}

// ServiceLabels adds labels.
func ServiceLabels(kv ...string) ServiceOption {
	return func(s *corev1.Service) { s.Labels = addLabels(s.Labels, kv) }
}

// ServiceResourceVersion sets metadata.resourceVersion.
func ServiceResourceVersion(rv string) ServiceOption {
	return func(s *corev1.Service) { s.ResourceVersion = rv }
}

func addLabels(m map[string]string, kv []string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// SliceOption changes one aspect of an EndpointSlice built by EndpointSlice.
type SliceOption func(*discoveryv1.EndpointSlice)

// EndpointSlice returns a slice labelled for service (an empty service leaves the
// kubernetes.io/service-name label off).
func EndpointSlice(namespace, name, service string, addressType discoveryv1.AddressType, opts ...SliceOption) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(namespace + "/" + name)},
		AddressType: addressType,
	}
	if service != "" {
		es.Labels = map[string]string{discoveryv1.LabelServiceName: service}
	}
	for _, o := range opts {
		o(es)
	}
	return es
}

// SlicePort adds a port.
func SlicePort(name string, port int32, proto corev1.Protocol) SliceOption {
	return func(es *discoveryv1.EndpointSlice) {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: Ptr(name), Port: Ptr(port), Protocol: Ptr(proto)})
	}
}

// RawSlicePort adds a port exactly as given (nil fields included), for bad-input tests.
func RawSlicePort(p discoveryv1.EndpointPort) SliceOption {
	return func(es *discoveryv1.EndpointSlice) { es.Ports = append(es.Ports, p) }
}

// Endpoints appends endpoints.
func Endpoints(eps ...discoveryv1.Endpoint) SliceOption {
	return func(es *discoveryv1.EndpointSlice) { es.Endpoints = append(es.Endpoints, eps...) }
}

// SliceLabels adds labels.
func SliceLabels(kv ...string) SliceOption {
	return func(es *discoveryv1.EndpointSlice) { es.Labels = addLabels(es.Labels, kv) }
}

// SliceResourceVersion sets metadata.resourceVersion.
func SliceResourceVersion(rv string) SliceOption {
	return func(es *discoveryv1.EndpointSlice) { es.ResourceVersion = rv }
}

// EndpointOption changes one aspect of an endpoint built by Endpoint.
type EndpointOption func(*discoveryv1.Endpoint)

// Endpoint returns an endpoint with the addresses (comma-separated for several)
// and all conditions unset, which the API reads as ready, serving, not terminating.
func Endpoint(addresses string, opts ...EndpointOption) discoveryv1.Endpoint {
	var ep discoveryv1.Endpoint
	if addresses != "" {
		ep.Addresses = strings.Split(addresses, ",")
	}
	for _, o := range opts {
		o(&ep)
	}
	return ep
}

// Ready sets conditions.ready.
func Ready(v bool) EndpointOption {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Ready = Ptr(v) }
}

// Serving sets conditions.serving.
func Serving(v bool) EndpointOption {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Serving = Ptr(v) }
}

// Terminating sets conditions.terminating.
func Terminating(v bool) EndpointOption {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Terminating = Ptr(v) }
}

// TerminatingServing marks the endpoint as the endpointslice controller does for a
// deleted pod that still passes readiness: ready false, serving true, terminating true.
func TerminatingServing() EndpointOption {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: Ptr(false), Serving: Ptr(true), Terminating: Ptr(true)}
	}
}

// OnNode sets nodeName.
func OnNode(node string) EndpointOption {
	return func(e *discoveryv1.Endpoint) { e.NodeName = Ptr(node) }
}

// InZone sets zone.
func InZone(zone string) EndpointOption {
	return func(e *discoveryv1.Endpoint) { e.Zone = Ptr(zone) }
}

// ZoneHints sets hints.forZones.
func ZoneHints(zones ...string) EndpointOption {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

// NodeHints sets hints.forNodes.
func NodeHints(nodes ...string) EndpointOption {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}
