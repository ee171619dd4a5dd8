package servicemap

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"
)

// Labels kube-proxy filters on.
const (
	// LabelServiceProxyName marks a Service that another proxy implementation owns;
	// kube-proxy (and this package) ignore such Services.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks the EndpointSlices of headless Services, which no proxy programs.
	LabelHeadless = v1.IsHeadlessService
)

// DefaultStickyMaxAgeSeconds is the ClientIP session affinity timeout when the
// Service does not set one (the API's default).
const DefaultStickyMaxAgeSeconds = v1.DefaultClientIPServiceAffinitySeconds

// parseIP accepts what kube-proxy accepts (IPv4 with leading zeros included) and
// returns the address in its canonical 4- or 16-byte form.
func parseIP(s string) (netip.Addr, bool) {
	// Fast path, no allocation: netip accepts the canonical forms. It also accepts
	// IPv6 zones, which kube-proxy does not; it rejects IPv4 with leading zeros,
	// which kube-proxy accepts, so those take the slow path.
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, false
		}
		return a.Unmap(), true
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func parseCIDR(s string) (netip.Prefix, bool) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a, ones).Masked(), true
}

// skipReason says why kube-proxy would not proxy svc at all, or "".
func skipReason(svc *v1.Service) string {
	switch {
	case svc.Spec.ClusterIP == v1.ClusterIPNone:
		return "headless Service (clusterIP None)"
	case svc.Spec.ClusterIP == "":
		return "Service has no cluster IP"
	case svc.Spec.Type == v1.ServiceTypeExternalName:
		return "ExternalName Service"
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return "Service is labelled " + LabelServiceProxyName
	}
	return ""
}

func externallyAccessible(svc *v1.Service) bool {
	return svc.Spec.Type == v1.ServiceTypeLoadBalancer ||
		svc.Spec.Type == v1.ServiceTypeNodePort ||
		(svc.Spec.Type == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) > 0)
}

// clusterIPs returns the Service's valid cluster IPs, pairing spec.ipFamilies with
// spec.clusterIPs as kube-proxy does (spec.clusterIP alone when ipFamilies is empty,
// for skewed API servers).
func clusterIPs(log logr.Logger, svc *v1.Service) []netip.Addr {
	var out []netip.Addr
	if len(svc.Spec.IPFamilies) == 0 {
		ip, ok := parseIP(svc.Spec.ClusterIP)
		if !ok {
			log.Info("Ignoring invalid cluster IP", "service", klogRef(svc.Namespace, svc.Name), "clusterIP", svc.Spec.ClusterIP)
			return nil
		}
		return append(out, ip)
	}
	for i, fam := range svc.Spec.IPFamilies {
		if i >= len(svc.Spec.ClusterIPs) {
			log.Info("Service lists an IP family without a cluster IP", "service", klogRef(svc.Namespace, svc.Name), "family", fam)
			continue
		}
		raw := svc.Spec.ClusterIPs[i]
		ip, ok := parseIP(raw)
		if !ok || familyOf(ip) != fam {
			log.Info("Ignoring invalid cluster IP", "service", klogRef(svc.Namespace, svc.Name), "clusterIP", raw, "family", fam)
			continue
		}
		if slices.Contains(out, ip) {
			continue
		}
		out = append(out, ip)
	}
	return out
}

// servicePorts converts a Service into its ports (without endpoints). It returns
// nil for a Service kube-proxy would not proxy.
func servicePorts(log logr.Logger, svc *v1.Service) []*ServicePort {
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	if reason := skipReason(svc); reason != "" {
		log.V(4).Info("Skipping Service", "service", nn.String(), "reason", reason)
		return nil
	}
	cips := clusterIPs(log, svc)
	if len(cips) == 0 {
		log.Info("Skipping Service without a valid cluster IP", "service", nn.String())
		return nil
	}

	var extIPs []netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		if ip, ok := parseIP(s); ok {
			extIPs = append(extIPs, ip)
		} else if strings.TrimSpace(s) != "" {
			log.Info("Ignoring invalid external IP", "service", nn.String(), "ip", s)
		}
	}
	var ranges []netip.Prefix
	for _, s := range svc.Spec.LoadBalancerSourceRanges {
		s = strings.TrimSpace(s)
		if p, ok := parseCIDR(s); ok {
			ranges = append(ranges, p)
		} else if s != "" {
			log.Info("Ignoring invalid load-balancer source range", "service", nn.String(), "cidr", s)
		}
	}
	var vips []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		if ip, ok := parseIP(ing.IP); ok {
			vips = append(vips, ip)
		} else {
			log.Info("Ignoring invalid load-balancer ingress IP", "service", nn.String(), "ip", ing.IP)
		}
	}

	extLocal := externallyAccessible(svc) && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	intLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	var sticky int32
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		sticky = DefaultStickyMaxAgeSeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			sticky = *c.ClientIP.TimeoutSeconds
		}
	}
	var hcPort int32
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && extLocal {
		hcPort = svc.Spec.HealthCheckNodePort
		if hcPort == 0 {
			log.Info("Service has no healthCheckNodePort", "service", nn.String())
		}
	}

	out := make([]*ServicePort, 0, len(svc.Spec.Ports))
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		proto := p.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		name := ServicePortName{NamespacedName: nn, Port: p.Name, Protocol: proto}
		sp := &ServicePort{
			Name:                     name,
			ClusterIPs:               cips,
			Port:                     p.Port,
			Protocol:                 proto,
			NodePort:                 p.NodePort,
			ExternalIPs:              extIPs,
			LoadBalancerVIPs:         vips,
			LoadBalancerSourceRanges: ranges,
			SessionAffinity:          svc.Spec.SessionAffinity,
			StickyMaxAgeSeconds:      sticky,
			ExternalPolicyLocal:      extLocal,
			InternalPolicyLocal:      intLocal,
			HealthCheckNodePort:      hcPort,
		}
		if j := slices.IndexFunc(out, func(o *ServicePort) bool { return o.Name == name }); j >= 0 {
			log.Info("Service has a duplicate port; the later one wins", "service", nn.String(), "port", name.String(), "protocol", proto)
			out[j] = sp
			continue
		}
		out = append(out, sp)
	}
	sortByName(out)
	return out
}

func klogRef(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// sliceFamily maps a slice's addressType to the IP family it carries.
func sliceFamily(t discovery.AddressType) (v1.IPFamily, bool) {
	switch t {
	case discovery.AddressTypeIPv4:
		return v1.IPv4Protocol, true
	case discovery.AddressTypeIPv6:
		return v1.IPv6Protocol, true
	}
	return "", false
}

// sliceEndpoints converts a slice's endpoints (without ports), skipping those a
// proxy cannot use: no address, an address that is not an IP, or one of the wrong
// family for the slice's addressType.
func sliceEndpoints(log logr.Logger, topos *topologies, es *discovery.EndpointSlice, fam v1.IPFamily) []Endpoint {
	out := make([]Endpoint, 0, len(es.Endpoints))
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		if len(e.Addresses) == 0 {
			log.Info("Ignoring endpoint without addresses", "endpointSlice", klogRef(es.Namespace, es.Name), "index", i)
			continue
		}
		ip, ok := parseIP(e.Addresses[0])
		if !ok {
			log.Info("Ignoring endpoint with an invalid address", "endpointSlice", klogRef(es.Namespace, es.Name), "address", e.Addresses[0])
			continue
		}
		if familyOf(ip) != fam {
			log.Info("Ignoring endpoint whose address does not match the slice's addressType",
				"endpointSlice", klogRef(es.Namespace, es.Name), "address", e.Addresses[0], "addressType", es.AddressType)
			continue
		}
		out = append(out, Endpoint{
			Addr:        ip,
			Ready:       CondOf(e.Conditions.Ready),
			Serving:     CondOf(e.Conditions.Serving),
			Terminating: CondOf(e.Conditions.Terminating),
			Topology:    topos.get(e),
		})
	}
	return out
}

// sortByName orders service ports by ServicePortName.
func sortByName(ports []*ServicePort) {
	slices.SortFunc(ports, func(a, b *ServicePort) int {
		switch {
		case a.Name.Less(b.Name):
			return -1
		case b.Name.Less(a.Name):
			return 1
		}
		return 0
	})
}
