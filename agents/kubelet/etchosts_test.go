package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const hostsBoilerplate = "# Kubernetes-managed hosts file.\n" +
	"127.0.0.1\tlocalhost\n" +
	"::1\tlocalhost ip6-localhost ip6-loopback\n" +
	"fe00::0\tip6-localnet\n" +
	"fe00::0\tip6-mcastprefix\n" +
	"fe00::1\tip6-allnodes\n" +
	"fe00::2\tip6-allrouters\n"

func TestManagedHostsFileBytes(t *testing.T) {
	aliases := []corev1.HostAlias{
		{IP: "127.0.0.1", Hostnames: []string{"foo.local", "bar.local"}},
		{IP: "10.1.2.3", Hostnames: []string{"foo.remote"}},
	}
	tests := map[string]struct {
		ips          []string
		host, domain string
		aliases      []corev1.HostAlias
		want         string
	}{
		"pod IP": {[]string{"10.200.0.4"}, "nginx", "", nil, hostsBoilerplate + "10.200.0.4\tnginx\n"},
		"dual stack with subdomain": {[]string{"10.0.0.5", "fd00::5"}, "web-0", "web.team.svc.cluster.local", nil,
			hostsBoilerplate + "10.0.0.5\tweb-0.web.team.svc.cluster.local\tweb-0\nfd00::5\tweb-0.web.team.svc.cluster.local\tweb-0\n"},
		"host aliases": {[]string{"10.0.0.5"}, "p", "", aliases, hostsBoilerplate + "10.0.0.5\tp\n" +
			"\n# Entries added by HostAliases.\n127.0.0.1\tfoo.local\tbar.local\n10.1.2.3\tfoo.remote\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, string(managedHostsContent(tc.ips, tc.host, tc.domain, tc.aliases)))
		})
	}
	assert.Equal(t, "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\nhostbox 10.0.0.1\n"+
		"\n# Entries added by HostAliases.\n10.1.2.3\tfoo.remote\n",
		string(hostNetworkHostsContent([]byte("127.0.0.1 localhost\nhostbox 10.0.0.1\n"), aliases[1:])))
}

func TestPodHostnameAndDomain(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "team"}}
	h, d := podHostnameAndDomain(p, "cluster.local")
	assert.Equal(t, "web-0", h)
	assert.Empty(t, d)
	p.Spec.Hostname, p.Spec.Subdomain = "db", "backend"
	h, d = podHostnameAndDomain(p, "cluster.local")
	assert.Equal(t, "db", h)
	assert.Equal(t, "backend.team.svc.cluster.local", d)
	p.Spec.Hostname = ""
	p.Name = "a123456789b123456789c123456789d123456789e123456789f123456789-.-xyz"
	h, _ = podHostnameAndDomain(p, "cluster.local")
	assert.Equal(t, "a123456789b123456789c123456789d123456789e123456789f123456789", h)
	p.Spec.Hostname, p.Spec.HostnameOverride = "db", ptr.To("override.example")
	h, d = podHostnameAndDomain(p, "cluster.local")
	assert.Equal(t, "override.example", h, "spec.hostnameOverride wins")
	assert.Empty(t, d, "and gets no domain, as the kubelet's GeneratePodHostNameAndDomain")
}

func TestHostsMount(t *testing.T) {
	dir := t.TempDir()
	nodeHosts := filepath.Join(dir, "node-hosts")
	require.NoError(t, os.WriteFile(nodeHosts, []byte("127.0.0.1 localhost node\n"), 0o644))
	cfg := testConfig(t)
	cfg.ClusterDomain = "cluster.local"
	b := &configBuilder{cfg: cfg, rootDir: dir, nodeHostsPath: nodeHosts}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1"}}
	c := &corev1.Container{Name: "c"}

	m, err := b.hostsMount(pod, c, nil)
	require.NoError(t, err)
	assert.Nil(t, m, "no pod IP yet: not managed")

	m, err = b.hostsMount(pod, c, []string{"10.0.0.9"})
	require.NoError(t, err)
	require.NotNil(t, m)
	assert.Equal(t, "/etc/hosts", m.ContainerPath)
	assert.Equal(t, filepath.Join(dir, "pods", "u1", "etc-hosts"), m.HostPath)
	got, err := os.ReadFile(m.HostPath)
	require.NoError(t, err)
	assert.Equal(t, hostsBoilerplate+"10.0.0.9\tp\n", string(got))
	st, err := os.Stat(m.HostPath)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())

	hostNet := pod.DeepCopy()
	hostNet.Spec.HostNetwork = true
	m, err = b.hostsMount(hostNet, c, []string{"192.168.1.2"})
	require.NoError(t, err)
	got, err = os.ReadFile(m.HostPath)
	require.NoError(t, err)
	assert.Equal(t, "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost node\n", string(got))

	own := &corev1.Container{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "h", MountPath: "/etc/hosts"}}}
	m, err = b.hostsMount(pod, own, []string{"10.0.0.9"})
	require.NoError(t, err)
	assert.Nil(t, m, "the container mounts its own /etc/hosts")
}
