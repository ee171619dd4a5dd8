package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// Upstream's well-known ports (pkg/cluster/ports) and defaults
// (pkg/proxy/apis/config/v1alpha1/defaults.go, pkg/kubelet/qos).
const (
	proxyHealthzPort     = 10256
	proxyStatusPort      = 10249
	kubeProxyOOMScoreAdj = -999

	modeNFTables = "nftables"
	modeIPTables = "iptables"

	nodePortAddressesPrimary   = "primary"
	nodePortAddressesAll       = "all"
	nodePortAddressesLocalhost = "localhost"

	// fullSyncPeriod is upstream's proxyutil.FullSyncPeriod: the longest a proxier
	// goes without a sync, and how often a sync is full even when nothing failed.
	fullSyncPeriod = time.Hour
)

var errInvalidConfig = errors.New("invalid configuration")

// options is the command line. Flags write straight into a defaulted
// configuration, as upstream's do; --config replaces that configuration with the
// file's (upstream ignores most flags when a file is given).
type options struct {
	configFile       string
	master           string
	hostnameOverride string
	netns            string
	clusterCIDR      string
	masqueradeAll    bool
	syncPeriod       time.Duration
	minSyncPeriod    time.Duration
	mode             string
	// cleanupAndExit is --cleanup: remove the rules of every mode and exit.
	cleanupAndExit bool

	cfg *v1alpha1.KubeProxyConfiguration
}

func newOptions() *options {
	o := &options{cfg: &v1alpha1.KubeProxyConfiguration{}}
	setDefaults(o.cfg)
	o.syncPeriod = o.cfg.IPTables.SyncPeriod.Duration
	o.minSyncPeriod = o.cfg.IPTables.MinSyncPeriod.Duration
	return o
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	c := o.cfg
	fs.StringVar(&o.configFile, "config", "", "The path to the configuration file.")
	fs.StringVar(&c.ClientConnection.Kubeconfig, "kubeconfig", "", "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&c.ClientConnection.ContentType, "kube-api-content-type", c.ClientConnection.ContentType, "Content type of requests sent to apiserver.")
	fs.Int32Var(&c.ClientConnection.Burst, "kube-api-burst", c.ClientConnection.Burst, "Burst to use while talking with kubernetes apiserver")
	fs.Float32Var(&c.ClientConnection.QPS, "kube-api-qps", c.ClientConnection.QPS, "QPS to use while talking with kubernetes apiserver")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.StringVar(&c.BindAddress, "bind-address", c.BindAddress, "Overrides kube-proxy's idea of what its node's primary IP is. This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", c.HealthzBindAddress, "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\". This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", c.MetricsBindAddress, "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&o.mode, "proxy-mode", "", "Which proxy mode to use: 'nftables' (the default in nodekit) or 'iptables'. This parameter is ignored if a config file is specified by --config.")
	fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "If using the iptables proxy mode, the bit of the fwmark space to mark packets requiring SNAT with. Must be within the range [0, 31].")
	fs.BoolVar(c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *c.IPTables.LocalhostNodePorts, "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4; localhost NodePorts are never allowed with other proxy modes or with IPv6.)")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs.")
	fs.DurationVar(&o.syncPeriod, "iptables-sync-period", o.syncPeriod, "The retry interval after a failed sync (e.g. '5s', '1m'). Must be greater than 0.")
	fs.DurationVar(&o.minSyncPeriod, "iptables-min-sync-period", o.minSyncPeriod, "The minimum period between rule resyncs (e.g. '5s', '1m'). A value of 0 means every Service or EndpointSlice change will result in an immediate resync.")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "", "The CIDR range of the pods in the cluster. Traffic to cluster IPs from outside it is masqueraded. This parameter is ignored if a config file is specified by --config.")
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", nil, "A list of CIDR ranges and/or the keywords 'primary' and 'all'. NodePort services are only accessible on node IPs covered by the list. If unset, this defaults to 'all' in iptables mode and to 'primary' in nftables mode. This parameter is ignored if a config file is specified by --config.")
	fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", c.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed. Must be greater than 0.")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler. This parameter is ignored if a config file is specified by --config.")
	fs.BoolVar(&o.cleanupAndExit, "cleanup", false, "If true cleanup iptables and ipvs rules and exit.")
	fs.StringVar(&o.netns, "netns", "", "nodekit: path of a network namespace (such as /proc/PID/ns/net or /run/netns/NAME) to write the rules and clean conntrack in. The API server is still reached from the process's own namespace. Empty: the process's own namespace.")
	logsapi.AddFlags(&c.Logging, fs)
}

// complete turns the command line into the configuration the agent runs with.
// logger receives the lines upstream logs while loading (lenient decoding).
func (o *options) complete(fs *pflag.FlagSet, logger klog.Logger) error {
	if o.configFile != "" {
		c, err := loadConfigFile(o.configFile, logger)
		if err != nil {
			return err
		}
		copyLoggingFlags(fs, &c.Logging)
		o.cfg = c
	} else {
		c := o.cfg
		c.Mode = v1alpha1.ProxyMode(o.mode)
		c.IPTables.MasqueradeAll = o.masqueradeAll
		c.NFTables.MasqueradeAll = o.masqueradeAll
		// The sync flags are named for iptables but, as upstream, apply to every mode
		// but ipvs.
		c.IPTables.SyncPeriod.Duration = o.syncPeriod
		c.IPTables.MinSyncPeriod.Duration = o.minSyncPeriod
		c.NFTables.SyncPeriod.Duration = o.syncPeriod
		c.NFTables.MinSyncPeriod.Duration = o.minSyncPeriod
		c.ClusterCIDR = o.clusterCIDR
		// The flags write the bind addresses as given; upstream's IPPortVar accepts
		// only IP:port, and the defaults already carry the port.
	}
	platformDefaults(o.cfg)
	if o.hostnameOverride != "" {
		h := strings.TrimSpace(o.hostnameOverride)
		if h == "" {
			return fmt.Errorf("%w: empty hostname-override is invalid", errInvalidConfig)
		}
		o.cfg.HostnameOverride = strings.ToLower(h)
	}
	if errs := validate(o.cfg); len(errs) > 0 {
		return fmt.Errorf("%w: %v", errInvalidConfig, errs.ToAggregate())
	}
	return nil
}

// copyLoggingFlags lets -v and the other logging flags override the file's
// logging section, as upstream's copyLogsFromFlags does.
func copyLoggingFlags(from *pflag.FlagSet, to *logsapi.LoggingConfiguration) {
	var clone pflag.FlagSet
	logsapi.AddFlags(to, &clone)
	clone.VisitAll(func(f *pflag.Flag) {
		if src := from.Lookup(f.Name); src != nil && src.Changed {
			_ = f.Value.Set(src.Value.String())
		}
	})
}

const (
	configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	configKind       = "KubeProxyConfiguration"
)

// loadConfigFile reads and defaults a KubeProxyConfiguration. Like upstream, a
// file that only fails strict decoding (an unknown or duplicated field) is
// accepted with a log line naming the field; anything else is an error.
func loadConfigFile(path string, logger klog.Logger) (*v1alpha1.KubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	return loadConfig(data, logger)
}

func loadConfig(data []byte, logger klog.Logger) (*v1alpha1.KubeProxyConfiguration, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("%w: failed to decode: %w", errInvalidConfig, err)
	}
	if tm.APIVersion != configAPIVersion || tm.Kind != configKind {
		return nil, fmt.Errorf("%w: failed to decode: apiVersion %q kind %q: want apiVersion %q kind %q",
			errInvalidConfig, tm.APIVersion, tm.Kind, configAPIVersion, configKind)
	}
	c := &v1alpha1.KubeProxyConfiguration{}
	if strictErr := yaml.UnmarshalStrict(data, c); strictErr != nil {
		c = &v1alpha1.KubeProxyConfiguration{}
		if err := yaml.Unmarshal(data, c); err != nil {
			return nil, fmt.Errorf("%w: failed to decode: %w", errInvalidConfig, err)
		}
		logger.Info("Using lenient decoding as strict decoding failed", "err", strictErr)
	}
	setDefaults(c)
	return c, nil
}

// setDefaults applies upstream's SetDefaults_KubeProxyConfiguration
// (pkg/proxy/apis/config/v1alpha1/defaults.go, v1.37.2) field for field.
func setDefaults(c *v1alpha1.KubeProxyConfiguration) {
	if c.BindAddress == "" {
		c.BindAddress = "0.0.0.0"
	}
	healthzHost, metricsHost := "[::]", "[::1]"
	if a, err := netip.ParseAddr(c.BindAddress); err == nil && a.Unmap().Is4() {
		healthzHost, metricsHost = "0.0.0.0", "127.0.0.1"
	}
	if c.HealthzBindAddress == "" {
		c.HealthzBindAddress = fmt.Sprintf("%s:%d", healthzHost, proxyHealthzPort)
	} else {
		c.HealthzBindAddress = appendPortIfNeeded(c.HealthzBindAddress, proxyHealthzPort)
	}
	if c.MetricsBindAddress == "" {
		c.MetricsBindAddress = fmt.Sprintf("%s:%d", metricsHost, proxyStatusPort)
	} else {
		c.MetricsBindAddress = appendPortIfNeeded(c.MetricsBindAddress, proxyStatusPort)
	}
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptr.To[int32](kubeProxyOOMScoreAdj)
	}
	setDuration(&c.IPTables.SyncPeriod, 30*time.Second)
	setDuration(&c.IPTables.MinSyncPeriod, time.Second)
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	setDuration(&c.IPVS.SyncPeriod, 30*time.Second)
	setDuration(&c.NFTables.SyncPeriod, 30*time.Second)
	setDuration(&c.NFTables.MinSyncPeriod, time.Second)
	if c.Conntrack.MaxPerCore == nil {
		c.Conntrack.MaxPerCore = ptr.To[int32](32 * 1024)
	}
	if c.Conntrack.Min == nil {
		c.Conntrack.Min = ptr.To[int32](128 * 1024)
	}
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = ptr.To[int32](14)
	}
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = ptr.To[int32](14)
	}
	if c.Conntrack.TCPEstablishedTimeout == nil {
		c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if c.Conntrack.TCPCloseWaitTimeout == nil {
		c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	setDuration(&c.ConfigSyncPeriod, 15*time.Minute)
	if c.ClientConnection.ContentType == "" {
		c.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if c.ClientConnection.QPS == 0 {
		c.ClientConnection.QPS = 5
	}
	if c.ClientConnection.Burst == 0 {
		c.ClientConnection.Burst = 10
	}
	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&c.Logging)
}

func setDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

// appendPortIfNeeded mirrors upstream's proxyutil.AppendPortIfNeeded: a bare IP
// gets the port, anything else is left for validation to judge.
func appendPortIfNeeded(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	return netip.AddrPortFrom(ip, uint16(port)).String()
}

// platformDefaults is upstream's platformApplyDefaults (server_linux.go), except
// that an unset mode means nftables here (upstream: iptables).
func platformDefaults(c *v1alpha1.KubeProxyConfiguration) {
	if c.Mode == "" {
		c.Mode = modeNFTables
	}
	if c.Mode == modeNFTables && len(c.NodePortAddresses) == 0 {
		c.NodePortAddresses = []string{nodePortAddressesPrimary}
	}
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = "ClusterCIDR"
	}
}

// syncPeriods returns the mode's sync period and minimum sync period.
func syncPeriods(c *v1alpha1.KubeProxyConfiguration) (sync, minSync time.Duration) {
	if c.Mode == modeNFTables {
		return c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	}
	return c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
}

func masquerade(c *v1alpha1.KubeProxyConfiguration) (bit int32, all bool) {
	if c.Mode == modeNFTables {
		return *c.NFTables.MasqueradeBit, c.NFTables.MasqueradeAll
	}
	return *c.IPTables.MasqueradeBit, c.IPTables.MasqueradeAll
}

// validate checks what upstream's validation.Validate checks, with upstream's
// field paths and messages, plus the modes nodekit implements.
func validate(c *v1alpha1.KubeProxyConfiguration) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("KubeProxyConfiguration")
	for _, mb := range []struct {
		path *field.Path
		bit  *int32
	}{
		{p.Child("KubeProxyIPTablesConfiguration", "MasqueradeBit"), c.IPTables.MasqueradeBit},
		{p.Child("KubeProxyNFTablesConfiguration", "MasqueradeBit"), c.NFTables.MasqueradeBit},
	} {
		if mb.bit != nil && (*mb.bit < 0 || *mb.bit > 31) {
			errs = append(errs, field.Invalid(mb.path, *mb.bit, "must be within the range [0, 31]"))
		}
	}
	if c.OOMScoreAdj != nil && (*c.OOMScoreAdj < -1000 || *c.OOMScoreAdj > 1000) {
		errs = append(errs, field.Invalid(p.Child("KubeProxyLinuxConfiguration", "OOMScoreAdj"), *c.OOMScoreAdj, "must be within the range [-1000, 1000]"))
	}
	switch c.Mode {
	case modeNFTables, modeIPTables:
	default:
		errs = append(errs, field.NotSupported(p.Child("Mode"), string(c.Mode), []string{modeNFTables, modeIPTables}))
	}
	if c.ClientConnection.QPS < 0 {
		errs = append(errs, field.Invalid(p.Child("ClientConnection", "QPS"), c.ClientConnection.QPS, "must be greater than or equal to 0"))
	}
	if c.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(p.Child("ClientConnection", "Burst"), c.ClientConnection.Burst, "must be greater than or equal to 0"))
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("ConfigSyncPeriod"), c.ConfigSyncPeriod, "must be greater than 0"))
	}
	syncP, minP := syncPeriods(c)
	if syncP <= 0 {
		errs = append(errs, field.Invalid(p.Child("SyncPeriod"), metav1.Duration{Duration: syncP}, "must be greater than 0"))
	}
	if minP < 0 {
		errs = append(errs, field.Invalid(p.Child("MinSyncPeriod"), metav1.Duration{Duration: minP}, "must be greater than or equal to 0"))
	}
	if minP > syncP {
		errs = append(errs, field.Invalid(p.Child("SyncPeriod"), metav1.Duration{Duration: minP}, fmt.Sprintf("must be greater than or equal to %s", p.Child("MinSyncPeriod"))))
	}
	if _, err := netip.ParseAddr(c.BindAddress); err != nil {
		errs = append(errs, field.Invalid(p.Child("BindAddress"), c.BindAddress, "not a valid textual representation of an IP address"))
	}
	if c.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(c.HealthzBindAddress, p.Child("HealthzBindAddress"))...)
	}
	errs = append(errs, validateHostPort(c.MetricsBindAddress, p.Child("MetricsBindAddress"))...)
	for i, a := range c.NodePortAddresses {
		if a == nodePortAddressesPrimary || a == nodePortAddressesAll || a == nodePortAddressesLocalhost {
			continue
		}
		if _, err := netip.ParsePrefix(a); err != nil {
			errs = append(errs, field.Invalid(p.Child("NodePortAddresses").Index(i), a, "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"))
		}
	}
	if c.ClusterCIDR != "" {
		cidrs := strings.Split(c.ClusterCIDR, ",")
		if len(cidrs) > 2 {
			errs = append(errs, field.Invalid(p.Child("DetectLocalConfiguration", "ClusterCIDRs"), cidrs, "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]"))
		}
		for i, s := range cidrs {
			if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
				errs = append(errs, field.Invalid(p.Child("DetectLocalConfiguration", "ClusterCIDRs").Index(i), s, "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"))
			}
		}
	}
	return errs
}

func validateHostPort(input string, path *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(input)
	if err != nil {
		return field.ErrorList{field.Invalid(path, input, "must be IP:port")}
	}
	var errs field.ErrorList
	if _, err := netip.ParseAddr(host); err != nil {
		errs = append(errs, field.Invalid(path, host, "must be a valid IP"))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, field.Invalid(path, port, "must be a valid port"))
	}
	return errs
}

// clusterCIDR4 returns the IPv4 entry of clusterCIDR.
func clusterCIDR4(c *v1alpha1.KubeProxyConfiguration) netip.Prefix {
	return clusterCIDRFor(c, v1.IPv4Protocol)
}

// clusterCIDRFor returns the entry of clusterCIDR (comma-separated, at most one
// per family) of the given family, as each of upstream's per-family proxiers
// takes its own.
func clusterCIDRFor(c *v1alpha1.KubeProxyConfiguration, family v1.IPFamily) netip.Prefix {
	for _, s := range strings.Split(c.ClusterCIDR, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil && isFamily(p.Addr(), family) {
			return p.Masked()
		}
	}
	return netip.Prefix{}
}

// unhonoured lists the configuration fields that upstream acts on and nodekit
// does not, with the values they hold. The agent logs each once at start.
func unhonoured(c *v1alpha1.KubeProxyConfiguration) []string {
	def := &v1alpha1.KubeProxyConfiguration{Mode: c.Mode}
	setDefaults(def)
	platformDefaults(def)
	var out []string
	add := func(name string, v any, zeroOK bool) {
		rv := reflect.ValueOf(v)
		if rv.IsZero() {
			return
		}
		if rv.Kind() == reflect.Pointer && rv.Elem().IsZero() && zeroOK {
			return
		}
		out = append(out, name)
	}
	// Upstream writes these sysctls or process settings at start; nodekit leaves
	// the host as it is.
	add("oomScoreAdj", c.OOMScoreAdj, true)
	add("conntrack.maxPerCore", c.Conntrack.MaxPerCore, true)
	add("conntrack.min", c.Conntrack.Min, true)
	add("conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout, true)
	add("conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout, true)
	add("conntrack.tcpBeLiberal", c.Conntrack.TCPBeLiberal, false)
	add("conntrack.udpTimeout", c.Conntrack.UDPTimeout.Duration, false)
	add("conntrack.udpStreamTimeout", c.Conntrack.UDPStreamTimeout.Duration, false)
	// Features nodekit does not implement.
	add("featureGates", len(c.FeatureGates), false)
	add("bindAddressHardFail", c.BindAddressHardFail, false)
	add("showHiddenMetricsForVersion", c.ShowHiddenMetricsForVersion, false)
	add("portRange", c.PortRange, false)
	add("windowsRunAsService", c.WindowsRunAsService, false)
	add("detectLocal.bridgeInterface", c.DetectLocal.BridgeInterface, false)
	add("detectLocal.interfaceNamePrefix", c.DetectLocal.InterfaceNamePrefix, false)
	if c.DetectLocalMode != "ClusterCIDR" {
		out = append(out, "detectLocalMode")
	}
	for _, a := range c.NodePortAddresses {
		if a == nodePortAddressesLocalhost && c.Mode != modeIPTables {
			out = append(out, "nodePortAddresses[localhost]")
		}
	}
	if c.Mode == modeIPTables && len(c.NodePortAddresses) > 0 && !reflect.DeepEqual(c.NodePortAddresses, []string{nodePortAddressesAll}) {
		out = append(out, "nodePortAddresses")
	}
	if !reflect.DeepEqual(c.IPVS, def.IPVS) {
		out = append(out, "ipvs")
	}
	if !reflect.DeepEqual(c.Winkernel, def.Winkernel) {
		out = append(out, "winkernel")
	}
	if len(c.ClientConnection.AcceptContentTypes) > 0 {
		out = append(out, "clientConnection.acceptContentTypes")
	}
	return out
}

// localhostNodePorts is upstream's decision for one family's iptables proxier:
// iptables.localhostNodePorts, kept only for IPv4 and only when the
// nodePortAddresses of the family (none meaning all) take in 127.0.0.1
// (NodePortAddresses.ContainsIPv4Loopback after the keywords are expanded:
// 'all' and 'localhost' do, 'primary' does not). nodekit's iptables mode answers
// NodePorts on every address whatever the list says, but the loopback decision
// follows the list as upstream's does.
func localhostNodePorts(c *v1alpha1.KubeProxyConfiguration, node *v1.Node, family v1.IPFamily) bool {
	if c.Mode != modeIPTables || family != v1.IPv4Protocol || !ptr.Deref(c.IPTables.LocalhostNodePorts, true) {
		return false
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	anyIPv4 := false
	for _, a := range c.NodePortAddresses {
		switch a {
		case nodePortAddressesAll, nodePortAddressesLocalhost:
			return true
		case nodePortAddressesPrimary:
			if ip := nodeIPFor(c, node, v1.IPv4Protocol); ip.IsValid() && !ip.IsLoopback() {
				anyIPv4 = true
			}
		default:
			if p, err := netip.ParsePrefix(a); err == nil && p.Addr().Is4() {
				anyIPv4 = true
				if p.Contains(loopback) {
					return true
				}
			}
		}
	}
	return !anyIPv4
}
