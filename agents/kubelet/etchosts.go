package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's managed hosts file (pkg/kubelet/kubelet_pods.go): written to
// <root>/pods/<uid>/etc-hosts and bind-mounted at /etc/hosts in every container
// that does not mount something there itself.
const (
	etcHostsPath         = "/etc/hosts"
	etcHostsFile         = "etc-hosts"
	managedHostsHeader   = "# Kubernetes-managed hosts file.\n"
	managedHostsHostNet  = "# Kubernetes-managed hosts file (host network).\n"
	hostAliasesHeader    = "# Entries added by HostAliases.\n"
	maxPodHostnameLength = 63
	defaultNodeHostsPath = "/etc/hosts"
	managedHostsFileMode = 0o644
)

// podHostnameAndDomain is the kubelet's GeneratePodHostNameAndDomain: spec.hostnameOverride
// with no domain, else the short hostname (spec.hostname or the pod name, cut to 63 bytes without a trailing '-'
// or '.') and, with a subdomain, <subdomain>.<namespace>.svc.<clusterDomain>.
func podHostnameAndDomain(pod *corev1.Pod, clusterDomain string) (string, string) {
	if o := pod.Spec.HostnameOverride; o != nil {
		// spec.hostnameOverride (GA in 1.37) is the hostname, with no domain.
		h := *o
		if len(h) > maxPodHostnameLength {
			h = strings.TrimRight(h[:maxPodHostnameLength], "-.")
		}
		return h, ""
	}
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if len(hostname) > maxPodHostnameLength {
		hostname = strings.TrimRight(hostname[:maxPodHostnameLength], "-.")
	}
	domain := ""
	if pod.Spec.Subdomain != "" {
		domain = fmt.Sprintf("%s.%s.svc.%s", pod.Spec.Subdomain, pod.Namespace, clusterDomain)
	}
	return hostname, domain
}

// managedHostsContent is the hosts file of a pod on the pod network: the header,
// the localhost lines, one line per pod IP naming the pod (FQDN first when it has
// a subdomain), then the hostAliases.
func managedHostsContent(podIPs []string, hostname, domain string, aliases []corev1.HostAlias) []byte {
	var b bytes.Buffer
	b.WriteString(managedHostsHeader)
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("fe00::0\tip6-localnet\n")
	b.WriteString("fe00::0\tip6-mcastprefix\n")
	b.WriteString("fe00::1\tip6-allnodes\n")
	b.WriteString("fe00::2\tip6-allrouters\n")
	for _, ip := range podIPs {
		if domain != "" {
			fmt.Fprintf(&b, "%s\t%s.%s\t%s\n", ip, hostname, domain, hostname)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
		}
	}
	b.Write(hostAliasesContent(aliases))
	return b.Bytes()
}

// hostNetworkHostsContent is the hosts file of a hostNetwork pod: the node's own
// file under the host-network header, then the hostAliases.
func hostNetworkHostsContent(node []byte, aliases []corev1.HostAlias) []byte {
	var b bytes.Buffer
	b.WriteString(managedHostsHostNet)
	b.Write(node)
	b.Write(hostAliasesContent(aliases))
	return b.Bytes()
}

// hostAliasesContent is one line per alias entry (all its hostnames
// tab-separated) after a blank line and the kubelet's comment; nothing without
// aliases.
func hostAliasesContent(aliases []corev1.HostAlias) []byte {
	if len(aliases) == 0 {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("\n")
	b.WriteString(hostAliasesHeader)
	for _, a := range aliases {
		fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
	return b.Bytes()
}

// hostsMount writes the pod's hosts file and returns its mount at /etc/hosts, or
// nil when the kubelet would not manage it: no pod IP known yet, or the container
// mounts a volume at /etc/hosts.
func (b *configBuilder) hostsMount(pod *corev1.Pod, c *corev1.Container, podIPs []string) (*runtimeapi.Mount, error) {
	if len(podIPs) == 0 {
		return nil, nil
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == etcHostsPath {
			return nil, nil
		}
	}
	var content []byte
	if pod.Spec.HostNetwork {
		nodeHostsPath := b.nodeHostsPath
		if nodeHostsPath == "" {
			nodeHostsPath = defaultNodeHostsPath
		}
		node, err := os.ReadFile(nodeHostsPath)
		if err != nil {
			return nil, fmt.Errorf("read the node's hosts file for pod %s: %w", podDesc(pod), err)
		}
		content = hostNetworkHostsContent(node, pod.Spec.HostAliases)
	} else {
		hostname, domain := podHostnameAndDomain(pod, b.cfg.ClusterDomain)
		content = managedHostsContent(podIPs, hostname, domain, pod.Spec.HostAliases)
	}
	dir := filepath.Join(b.rootDir, "pods", string(pod.UID))
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create pod directory: %w", err)
	}
	p := filepath.Join(dir, etcHostsFile)
	if err := os.WriteFile(p, content, managedHostsFileMode); err != nil {
		return nil, fmt.Errorf("write hosts file of pod %s: %w", podDesc(pod), err)
	}
	// WriteFile keeps an existing file's mode and applies the umask to a new one.
	if err := os.Chmod(p, managedHostsFileMode); err != nil {
		return nil, err
	}
	return &runtimeapi.Mount{HostPath: p, ContainerPath: etcHostsPath, SelinuxRelabel: true}, nil
}
