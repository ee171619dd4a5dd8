package podenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// masterService is the service whose variables every container gets.
const masterService = "kubernetes"

// serviceEnv is the kubelet's getServiceEnvVarMap: the variables of every
// service with a cluster IP in ns when links are enabled, and of the master
// service always. A service named like the master service in the pod's own
// namespace takes its place when links are enabled, as upstream's map does.
func (b *Builder) serviceEnv(ctx context.Context, ns string, links bool) (map[string]string, error) {
	chosen := map[string]*corev1.Service{}
	if ns != b.cfg.MasterServiceNamespace || !links {
		master, err := b.cfg.Source.Services(ctx, b.cfg.MasterServiceNamespace)
		if err != nil {
			return nil, fmt.Errorf("failed to list services when setting up env vars: %w", &sourceError{what: "services", err: err})
		}
		for _, s := range master {
			if s != nil && s.Name == masterService && serviceIPSet(s) {
				chosen[s.Name] = s
			}
		}
	}
	if links {
		local, err := b.cfg.Source.Services(ctx, ns)
		if err != nil {
			return nil, fmt.Errorf("failed to list services when setting up env vars: %w", &sourceError{what: "services", err: err})
		}
		for _, s := range local {
			if s != nil && serviceIPSet(s) {
				chosen[s.Name] = s
			}
		}
	}
	out := map[string]string{}
	for _, name := range sortedKeys(chosen) {
		for _, kv := range ServiceVars(chosen[name]) {
			out[kv[0]] = kv[1]
		}
	}
	return out, nil
}

func serviceIPSet(s *corev1.Service) bool {
	return s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone
}

// ServiceVars returns the variables the kubelet derives from one Service, in the
// order pkg/kubelet/envvars.FromServices writes them, as name/value pairs:
//
//	FOO_SERVICE_HOST=10.0.0.11
//	FOO_SERVICE_PORT=80                 (the first port)
//	FOO_SERVICE_PORT_HTTP=80            (each named port)
//	FOO_PORT=tcp://10.0.0.11:80         (the first port)
//	FOO_PORT_80_TCP=tcp://10.0.0.11:80  (each port, then _PROTO, _PORT, _ADDR)
//
// Dashes in names become underscores and letters are upper-cased. A service
// without a cluster IP ("" or "None") or without ports gives nothing.
func ServiceVars(s *corev1.Service) [][2]string {
	if s == nil || !serviceIPSet(s) || len(s.Spec.Ports) == 0 {
		return nil
	}
	prefix := envName(s.Name)
	ip := s.Spec.ClusterIP
	out := [][2]string{
		{prefix + "_SERVICE_HOST", ip},
		{prefix + "_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port))},
	}
	for _, p := range s.Spec.Ports {
		if p.Name != "" {
			out = append(out, [2]string{prefix + "_SERVICE_PORT_" + envName(p.Name), strconv.Itoa(int(p.Port))})
		}
	}
	for i, p := range s.Spec.Ports {
		proto := string(corev1.ProtocolTCP)
		if p.Protocol != "" {
			proto = string(p.Protocol)
		}
		port := strconv.Itoa(int(p.Port))
		url := strings.ToLower(proto) + "://" + net.JoinHostPort(ip, port)
		if i == 0 {
			out = append(out, [2]string{prefix + "_PORT", url})
		}
		pp := prefix + "_PORT_" + port + "_" + strings.ToUpper(proto)
		out = append(out,
			[2]string{pp, url},
			[2]string{pp + "_PROTO", strings.ToLower(proto)},
			[2]string{pp + "_PORT", port},
			[2]string{pp + "_ADDR", ip},
		)
	}
	return out
}

func envName(s string) string {
	return strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
}
