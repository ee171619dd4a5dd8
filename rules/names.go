package rules

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
)

// nftables chain-name prefixes, as kube-proxy's nftables mode spells them.
const (
	nftServicePrefix  = "service-"
	nftExternalPrefix = "external-"
	nftLocalPrefix    = "local-"
	nftEndpointPrefix = "endpoint-"
	nftAffinityPrefix = "affinity-"
	nftFirewallPrefix = "firewall-"
	// nftNameMax is nftables' limit on object names; kube-proxy keeps 16 for the
	// prefix and truncates the rest.
	nftNameMax     = 256
	nftNameBaseMax = nftNameMax - 16
)

// nftHashName is kube-proxy's nftables naming: the first 8 base32 characters of the
// SHA-256 of name, a dash, then name itself (truncated, so it stays readable yet unique).
func nftHashName(name string) string {
	sum := sha256.Sum256([]byte(name))
	out := base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
	if len(out) > nftNameBaseMax {
		out = out[:nftNameBaseMax-3] + "..."
	}
	return out
}

// nftServiceBase is "HASH-ns/name/proto/port", the suffix of a service port's chains.
func nftServiceBase(s *Service) string {
	return nftHashName(fmt.Sprintf("%s/%s/%s/%s", s.Namespace, s.Name, s.Protocol.lower(), s.PortName))
}

// nftEndpointBase is "HASH-ns/name/proto/port__ip/port", the suffix of an endpoint's
// chain and affinity set. An IPv6 address has its colons, which chain names cannot
// hold, replaced by dots, as kube-proxy does.
func nftEndpointBase(s *Service, ep Endpoint) string {
	return nftHashName(fmt.Sprintf("%s/%s/%s/%s__%s/%d", s.Namespace, s.Name, s.Protocol.lower(), s.PortName,
		strings.ReplaceAll(ep.IP.String(), ":", "."), ep.Port))
}

// iptablesHash is kube-proxy's iptables chain-name hash: the first 16 base32
// characters of the SHA-256 of the service port name (ns/name:port) plus the protocol
// (lower case), with the endpoint appended for KUBE-SEP chains.
func iptablesHash(servicePortName, protocol, endpoint string) string {
	sum := sha256.Sum256([]byte(servicePortName + protocol + endpoint))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}
