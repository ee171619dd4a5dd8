package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/podenv"
	"github.com/nodekit-dev/nodekit/probe"
	"github.com/nodekit-dev/nodekit/volume"
)

// configBuilder is podsync's ConfigBuilder: cri's sandbox and container configs (the
// kubelet's labels, annotations, resources, security) plus what the API holds: DNS,
// the environment from podenv, the volume mounts from volume and the termination
// message file.
type configBuilder struct {
	cfg     *kubeletv1beta1.KubeletConfiguration
	rootDir string
	env     *podenv.Builder
	volumes *volume.Manager
	hostIPs []string
	// hostResolv is the node's resolv.conf (resolvConf), read for DNS policies that
	// inherit it.
	hostResolv string
	events     podEvents
	// cgroups gives each sandbox its pod cgroup as CgroupParent; nil leaves it to
	// the runtime.
	cgroups *podCgroups
	// nodeHostsPath is the node's hosts file, copied for hostNetwork pods (default
	// /etc/hosts).
	nodeHostsPath string
	// noImageMounts, when set, says why the runtime cannot mount image volumes
	// (imageMountsMissing).
	noImageMounts string
}

// podEvents records events for the builder's warnings (DNS).
type podEvents interface {
	Eventf(pod *corev1.Pod, eventType, reason, format string, args ...any)
}

func (b *configBuilder) SandboxConfig(ctx context.Context, pod *corev1.Pod, attempt uint32) (*runtimeapi.PodSandboxConfig, error) {
	dns, err := b.dnsConfig(pod)
	if err != nil {
		return nil, err
	}
	parent := ""
	if b.cgroups != nil {
		parent = b.cgroups.podName(pod)
	}
	sc, err := cri.PodSandboxConfig(pod, cri.PodOptions{
		CgroupParent:  parent,
		LogsDir:       b.cfg.PodLogsDir,
		Attempt:       attempt,
		DNS:           dns,
		ClusterDomain: b.cfg.ClusterDomain,
	})
	if err != nil {
		return nil, err
	}
	// The kubelet makes the pod's log directory before it runs the sandbox.
	if err := os.MkdirAll(sc.GetLogDirectory(), 0o755); err != nil {
		return nil, fmt.Errorf("create pod log directory: %w", err)
	}
	return sc, nil
}

func (b *configBuilder) ContainerConfig(ctx context.Context, pod *corev1.Pod, c *corev1.Container, restartCount int, imageRef string, podIPs []string) (*runtimeapi.ContainerConfig, error) {
	cc, err := cri.ContainerConfig(pod, c.Name, restartCount, imageRef)
	if err != nil {
		return nil, err
	}
	env, err := b.env.Env(ctx, pod, c, podIPs, b.hostIPs)
	if err != nil {
		return nil, err
	}
	cc.Envs = env
	// $(VAR) in command and args expand against the whole environment, as upstream.
	vars := make([]corev1.EnvVar, 0, len(env))
	for _, kv := range env {
		vars = append(vars, corev1.EnvVar{Name: kv.GetKey(), Value: string(kv.GetValue())})
	}
	cc.Command = probe.ExpandCommand(c.Command, vars)
	cc.Args = probe.ExpandCommand(c.Args, vars)

	if err := b.checkImageMounts(pod, c); err != nil {
		return nil, err
	}
	mounts, err := b.volumes.Mounts(pod, c, env...)
	if err != nil {
		return nil, err
	}
	// A hostNetwork pod has the node's addresses; the sandbox reports none.
	hostsIPs := podIPs
	if pod.Spec.HostNetwork && len(hostsIPs) == 0 {
		hostsIPs = b.hostIPs
	}
	if hm, err := b.hostsMount(pod, c, hostsIPs); err != nil {
		return nil, err
	} else if hm != nil {
		mounts = append(mounts, hm)
	}
	if tm, err := b.terminationMessageMount(pod, c); err != nil {
		return nil, err
	} else if tm != nil {
		mounts = append(mounts, tm)
	}
	cc.Mounts = mounts
	return cc, nil
}

// terminationMessageMount makes the host file the container writes its termination
// message into (pods/<uid>/containers/<name>/<random>) and mounts it at
// terminationMessagePath, as the kubelet's makeMounts does.
func (b *configBuilder) terminationMessageMount(pod *corev1.Pod, c *corev1.Container) (*runtimeapi.Mount, error) {
	if c.TerminationMessagePath == "" {
		return nil, nil
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == c.TerminationMessagePath {
			return nil, nil
		}
	}
	dir := filepath.Join(b.rootDir, "pods", string(pod.UID), "containers", c.Name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create container directory: %w", err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	path := filepath.Join(dir, hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return nil, fmt.Errorf("create termination message file: %w", err)
	}
	f.Close()
	// World-writable, so a container running as any user can write its message.
	if err := os.Chmod(path, 0o666); err != nil {
		return nil, err
	}
	return &runtimeapi.Mount{HostPath: path, ContainerPath: c.TerminationMessagePath}, nil
}

// The kubelet's resolv.conf limits (pkg/kubelet/network/dns).
const (
	maxDNSNameservers = 3
	maxDNSSearchPaths = 32
	ndotsClusterFirst = "ndots:5"
)

// dnsConfig is the sandbox's resolv.conf as the kubelet's DNS configurer writes it
// for the pod's dnsPolicy and dnsConfig.
func (b *configBuilder) dnsConfig(pod *corev1.Pod) (*runtimeapi.DNSConfig, error) {
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	// ClusterFirst on the host network behaves as Default; ClusterFirstWithHostNet
	// off it behaves as ClusterFirst.
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	if policy == corev1.DNSClusterFirstWithHostNet {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && len(b.cfg.ClusterDNS) == 0 {
		// The kubelet falls back to the Default policy and says so.
		if b.events != nil {
			b.events.Eventf(pod, corev1.EventTypeWarning, "MissingClusterDNS",
				"pod: %q. kubelet does not have ClusterDNS IP configured and cannot create Pod using %q policy. Falling back to %q policy.",
				podDesc(pod), corev1.DNSClusterFirst, corev1.DNSDefault)
		}
		policy = corev1.DNSDefault
	}
	out := &runtimeapi.DNSConfig{}
	switch policy {
	case corev1.DNSNone:
	case corev1.DNSClusterFirst:
		out.Servers = append([]string(nil), b.cfg.ClusterDNS...)
		host := parseResolvConf(b.hostResolv)
		out.Searches = append(clusterSearches(pod.Namespace, b.cfg.ClusterDomain), host.Searches...)
		out.Options = []string{ndotsClusterFirst}
	default: // Default: the node's resolv.conf
		host := parseResolvConf(b.hostResolv)
		out.Servers, out.Searches, out.Options = host.Servers, host.Searches, host.Options
	}
	if dc := pod.Spec.DNSConfig; dc != nil {
		out.Servers = appendUnique(out.Servers, dc.Nameservers...)
		out.Searches = appendUnique(out.Searches, dc.Searches...)
		out.Options = mergeDNSOptions(out.Options, dc.Options)
	}
	if len(out.Servers) > maxDNSNameservers {
		out.Servers = out.Servers[:maxDNSNameservers]
	}
	if len(out.Searches) > maxDNSSearchPaths {
		out.Searches = out.Searches[:maxDNSSearchPaths]
	}
	return out, nil
}

func clusterSearches(namespace, domain string) []string {
	if domain == "" {
		return nil
	}
	return []string{namespace + ".svc." + domain, "svc." + domain, domain}
}

func parseResolvConf(content string) *runtimeapi.DNSConfig {
	out := &runtimeapi.DNSConfig{}
	for line := range strings.Lines(content) {
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) > 1 {
				out.Servers = append(out.Servers, f[1])
			}
		case "search":
			// The last search line wins, as in the resolver.
			out.Searches = nil
			for _, s := range f[1:] {
				if s != "." {
					out.Searches = append(out.Searches, strings.TrimSuffix(s, "."))
				}
			}
		case "options":
			out.Options = append(out.Options, f[1:]...)
		}
	}
	return out
}

func appendUnique(list []string, add ...string) []string {
	for _, a := range add {
		if !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	return list
}

// mergeDNSOptions lets the pod's options override the same-named ones.
func mergeDNSOptions(base []string, opts []corev1.PodDNSConfigOption) []string {
	byName := map[string]string{}
	var order []string
	put := func(name, full string) {
		if _, ok := byName[name]; !ok {
			order = append(order, name)
		}
		byName[name] = full
	}
	for _, o := range base {
		name, _, _ := strings.Cut(o, ":")
		put(name, o)
	}
	for _, o := range opts {
		full := o.Name
		if o.Value != nil {
			full += ":" + *o.Value
		}
		put(o.Name, full)
	}
	out := make([]string, 0, len(order))
	for _, n := range order {
		out = append(out, byName[n])
	}
	return out
}

func podDesc(pod *corev1.Pod) string {
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}
