package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

func parse(t *testing.T, args ...string) (*options, error) {
	t.Helper()
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	o := newOptions()
	o.addFlags(fs)
	require.NoError(t, fs.Parse(args))
	return o, o.complete(fs, klog.Background())
}

func TestDefaultsMatchUpstream(t *testing.T) {
	o, err := parse(t)
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, "0.0.0.0", c.BindAddress)
	assert.Equal(t, "0.0.0.0:10256", c.HealthzBindAddress)
	assert.Equal(t, "127.0.0.1:10249", c.MetricsBindAddress)
	assert.Equal(t, int32(-999), *c.OOMScoreAdj)
	assert.Equal(t, 30*time.Second, c.IPTables.SyncPeriod.Duration)
	assert.Equal(t, time.Second, c.IPTables.MinSyncPeriod.Duration)
	assert.Equal(t, 30*time.Second, c.NFTables.SyncPeriod.Duration)
	assert.Equal(t, time.Second, c.NFTables.MinSyncPeriod.Duration)
	assert.Equal(t, 30*time.Second, c.IPVS.SyncPeriod.Duration)
	assert.True(t, *c.IPTables.LocalhostNodePorts)
	assert.Equal(t, int32(14), *c.IPTables.MasqueradeBit)
	assert.Equal(t, int32(14), *c.NFTables.MasqueradeBit)
	assert.Equal(t, int32(32*1024), *c.Conntrack.MaxPerCore)
	assert.Equal(t, int32(128*1024), *c.Conntrack.Min)
	assert.Equal(t, 24*time.Hour, c.Conntrack.TCPEstablishedTimeout.Duration)
	assert.Equal(t, time.Hour, c.Conntrack.TCPCloseWaitTimeout.Duration)
	assert.Equal(t, 15*time.Minute, c.ConfigSyncPeriod.Duration)
	assert.Equal(t, "application/vnd.kubernetes.protobuf", c.ClientConnection.ContentType)
	assert.Equal(t, float32(5), c.ClientConnection.QPS)
	assert.Equal(t, int32(10), c.ClientConnection.Burst)
	assert.Equal(t, "text", c.Logging.Format)
	// Platform defaults: nodekit's mode default is nftables (upstream: iptables),
	// and nftables mode means 'primary' NodePort addresses, as upstream.
	assert.Equal(t, v1alpha1.ProxyMode("nftables"), c.Mode)
	assert.Equal(t, []string{"primary"}, c.NodePortAddresses)
	assert.Equal(t, v1alpha1.LocalMode("ClusterCIDR"), c.DetectLocalMode)
}

func TestIPv6BindAddressDefaults(t *testing.T) {
	c := &v1alpha1.KubeProxyConfiguration{BindAddress: "::"}
	setDefaults(c)
	assert.Equal(t, "[::]:10256", c.HealthzBindAddress)
	assert.Equal(t, "[::1]:10249", c.MetricsBindAddress)
	c = &v1alpha1.KubeProxyConfiguration{HealthzBindAddress: "127.0.0.1", MetricsBindAddress: "0.0.0.0:9999"}
	setDefaults(c)
	assert.Equal(t, "127.0.0.1:10256", c.HealthzBindAddress, "a bare IP gets the default port")
	assert.Equal(t, "0.0.0.0:9999", c.MetricsBindAddress)
}

func TestFlags(t *testing.T) {
	o, err := parse(t, "--proxy-mode=iptables", "--hostname-override= Node-1 ", "--cluster-cidr=10.244.0.0/16",
		"--masquerade-all", "--healthz-bind-address=127.0.0.1:20256", "--metrics-bind-address=127.0.0.1:20249",
		"--iptables-min-sync-period=0", "--iptables-sync-period=10s", "--netns=/proc/1/ns/net", "-v=4",
		"--nodeport-addresses=192.0.2.0/24")
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, v1alpha1.ProxyMode("iptables"), c.Mode)
	assert.Equal(t, "node-1", c.HostnameOverride)
	assert.Equal(t, "10.244.0.0/16", clusterCIDR4(c).String())
	bit, all := masquerade(c)
	assert.Equal(t, int32(14), bit)
	assert.True(t, all)
	s, m := syncPeriods(c)
	assert.Equal(t, 10*time.Second, s)
	assert.Equal(t, time.Duration(0), m)
	assert.Equal(t, "/proc/1/ns/net", o.netns)
	assert.Equal(t, uint32(4), uint32(c.Logging.Verbosity))
	assert.Equal(t, []string{"192.0.2.0/24"}, c.NodePortAddresses)
}

func TestInvalidFlagsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-mode=ipvs"}, `KubeProxyConfiguration.Mode: Unsupported value: "ipvs"`},
		{[]string{"--iptables-masquerade-bit=40", "--proxy-mode=iptables"}, "KubeProxyConfiguration.KubeProxyIPTablesConfiguration.MasqueradeBit: Invalid value: 40: must be within the range [0, 31]"},
		{[]string{"--iptables-sync-period=1s", "--iptables-min-sync-period=2s"}, "KubeProxyConfiguration.SyncPeriod"},
		{[]string{"--healthz-bind-address=nonsense"}, "KubeProxyConfiguration.HealthzBindAddress: Invalid value: \"nonsense\": must be IP:port"},
		{[]string{"--cluster-cidr=10.244.0.0/33"}, "KubeProxyConfiguration.DetectLocalConfiguration.ClusterCIDRs[0]"},
		{[]string{"--nodeport-addresses=everywhere"}, "KubeProxyConfiguration.NodePortAddresses[0]"},
		{[]string{"--hostname-override=  "}, "empty hostname-override is invalid"},
	} {
		_, err := parse(t, tc.args...)
		require.Error(t, err, tc.args)
		assert.ErrorIs(t, err, errInvalidConfig)
		assert.Contains(t, err.Error(), tc.want, tc.args)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestConfigFile(t *testing.T) {
	p := writeFile(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: 10.244.0.0/16
iptables:
  minSyncPeriod: 0s
  syncPeriod: 5s
  masqueradeAll: true
healthzBindAddress: 127.0.0.1:30256
conntrack:
  maxPerCore: 0
`)
	// Flags other than logging and hostname-override are ignored with --config.
	o, err := parse(t, "--config="+p, "--proxy-mode=nftables", "--hostname-override=n9", "-v=3")
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, v1alpha1.ProxyMode("iptables"), c.Mode)
	assert.Equal(t, "n9", c.HostnameOverride)
	assert.Equal(t, uint32(3), uint32(c.Logging.Verbosity))
	s, m := syncPeriods(c)
	assert.Equal(t, 5*time.Second, s)
	assert.Equal(t, time.Second, m, "an explicit 0s in a file is defaulted to 1s, as upstream")
	_, all := masquerade(c)
	assert.True(t, all)
	assert.Equal(t, "127.0.0.1:30256", c.HealthzBindAddress)
	assert.Equal(t, "127.0.0.1:10249", c.MetricsBindAddress, "unset fields get upstream defaults")
	assert.Equal(t, int32(0), *c.Conntrack.MaxPerCore, "an explicit 0 is kept")
}

func TestConfigFileErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"wrong kind", "apiVersion: v1\nkind: Pod\n", `apiVersion "v1" kind "Pod"`},
		{"wrong type", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnftables:\n  syncPeriod: [1]\n", "syncPeriod"},
		{"invalid value", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnftables:\n  masqueradeBit: 99\n", "KubeProxyNFTablesConfiguration.MasqueradeBit"},
		{"not yaml", "{", "failed to decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, "--config="+writeFile(t, tc.body))
			require.Error(t, err)
			assert.ErrorIs(t, err, errInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := parse(t, "--config=/nonexistent/kube-proxy.yaml")
	assert.ErrorIs(t, err, errInvalidConfig)
}

func TestConfigFileUnknownFieldIsLenient(t *testing.T) {
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	c, err := loadConfig([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nfancyNewField: 1\n"), logger)
	require.NoError(t, err)
	assert.Equal(t, v1alpha1.ProxyMode("nftables"), c.Mode)
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], "Using lenient decoding as strict decoding failed")
	assert.Contains(t, lines[0], "fancyNewField")
}

func TestUnhonouredFields(t *testing.T) {
	c := &v1alpha1.KubeProxyConfiguration{Mode: "nftables"}
	setDefaults(c)
	platformDefaults(c)
	c.Conntrack.MaxPerCore = ptr.To[int32](0)
	c.Conntrack.Min = ptr.To[int32](0)
	c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{}
	c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{}
	c.OOMScoreAdj = ptr.To[int32](0)
	assert.Empty(t, unhonoured(c), "zeroed host settings are nothing to honour")
	c.EnableProfiling = true // honoured: /debug/pprof on the metrics server
	c.IPVS.Scheduler = "rr"
	c.Conntrack.MaxPerCore = ptr.To[int32](1)
	assert.Equal(t, []string{"conntrack.maxPerCore", "ipvs"}, unhonoured(c))
}

func TestHealthzBody(t *testing.T) {
	registerMetrics()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC))
	var node *corev1.Node
	h := newHealthServer(clk, time.Minute, func() *corev1.Node { return node })
	srv := httptest.NewServer(h.handler())
	defer srv.Close()
	get := func(path string) (int, map[string]any) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
	}

	h.Updated(corev1.IPv4Protocol)
	code, body := get("/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "no Node yet: not eligible")
	assert.Equal(t, false, body["nodeEligible"])
	code, body = get("/livez")
	assert.Equal(t, http.StatusOK, code, "livez ignores the node")
	assert.NotContains(t, body, "nodeEligible")

	node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	code, body = get("/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, true, body["healthy"])
	assert.Equal(t, map[string]any{"IPv4": map[string]any{"lastUpdated": "2026-12-03T06:00:00Z", "healthy": true}}, body["status"])
	assert.Equal(t, "2026-12-03T06:00:00Z", body["currentTime"])

	h.QueuedUpdate(corev1.IPv4Protocol)
	clk.Step(59 * time.Second)
	code, _ = get("/healthz")
	assert.Equal(t, http.StatusOK, code, "pending for less than the timeout")
	clk.Step(time.Second)
	code, body = get("/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "pending for the timeout")
	assert.Equal(t, false, body["healthy"])
	code, _ = get("/livez")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	h.Updated(corev1.IPv4Protocol)
	code, _ = get("/healthz")
	assert.Equal(t, http.StatusOK, code)

	node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: toBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}}}
	code, _ = get("/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "autoscaler is deleting the node")
}

// A configuration as kubeadm writes it into the kube-proxy ConfigMap loads
// without complaint (every field is known) and keeps upstream's meaning of an
// empty mode apart from nodekit's default.
func TestKubeadmStyleConfig(t *testing.T) {
	var lines []string
	logger := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{})
	c, err := loadConfig([]byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`), logger)
	require.NoError(t, err)
	assert.Empty(t, lines, "strict decoding accepts every kubeadm field")
	platformDefaults(c)
	require.Empty(t, validate(c))
	assert.Equal(t, "/var/lib/kube-proxy/kubeconfig.conf", c.ClientConnection.Kubeconfig)
	assert.Equal(t, v1alpha1.ProxyMode("nftables"), c.Mode)
	assert.Equal(t, "0.0.0.0:10256", c.HealthzBindAddress)
	assert.Equal(t, 30*time.Second, c.NFTables.SyncPeriod.Duration)
	assert.Equal(t, "10.244.0.0/16", clusterCIDR4(c).String())
}

func TestNSRunnerBadPath(t *testing.T) {
	_, err := startNSRunner("/nonexistent/ns/net")
	assert.ErrorIs(t, err, errNetns)
	assert.Contains(t, err.Error(), "/nonexistent/ns/net")
}

// The binary refuses an invalid file, naming the field, before touching anything.
func TestBinaryRefusesInvalidConfig(t *testing.T) {
	p := writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n")
	out, err := exec.Command(agentBin, "--config="+p).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, string(out), `KubeProxyConfiguration.Mode: Unsupported value: "ipvs"`)
}
