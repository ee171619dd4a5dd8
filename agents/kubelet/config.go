package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	cliflag "k8s.io/component-base/cli/flag"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// ErrInvalidConfig marks a KubeletConfiguration file or a flag the agent refuses.
var ErrInvalidConfig = errors.New("invalid kubelet configuration")

// Defaults the upstream kubelet applies that are not KubeletConfiguration defaults
// (pkg/kubelet/eviction/defaults_linux.go and the kubelet's flag defaults).
const (
	defaultRootDir       = "/var/lib/kubelet"
	defaultEndpoint      = "unix:///run/containerd/containerd.sock"
	defaultResolvConf    = "/etc/resolv.conf"
	defaultPodLogsDir    = "/var/log/pods"
	defaultKubeletPort   = 10250
	defaultHealthzPort   = 10248
	defaultMaxPods       = 110
	defaultMaxImages     = 50
	defaultLeaseDuration = 40
)

// defaultEvictionHard is the kubelet's hard eviction thresholds on Linux. They drive
// the pressure conditions and are subtracted from allocatable.
var defaultEvictionHard = map[string]string{
	"memory.available":   "100Mi",
	"nodefs.available":   "10%",
	"nodefs.inodesFree":  "5%",
	"imagefs.available":  "15%",
	"imagefs.inodesFree": "5%",
}

// honouredFields are the KubeletConfiguration fields (JSON names) this agent acts on.
// Any other field set in the file is logged once by name as not honoured.
var honouredFields = map[string]bool{
	"apiVersion": true, "kind": true,
	"staticPodPath": true, "podLogsDir": true, "syncFrequency": true, "fileCheckFrequency": true,
	"healthzPort": true, "healthzBindAddress": true,
	"clusterDomain": true, "clusterDNS": true, "resolvConf": true,
	"nodeStatusUpdateFrequency": true, "nodeStatusReportFrequency": true, "nodeLeaseDurationSeconds": true,
	"nodeStatusMaxImages": true, "maxPods": true, "runtimeRequestTimeout": true,
	"containerRuntimeEndpoint": true, "evictionHard": true, "registerNode": true,
	// Node-pressure eviction (eviction*.go).
	"evictionSoft": true, "evictionSoftGracePeriod": true, "evictionMinimumReclaim": true,
	"evictionMaxPodGracePeriod": true, "evictionPressureTransitionPeriod": true, "localStorageCapacityIsolation": true,
	"registerWithTaints": true, "kubeAPIQPS": true, "kubeAPIBurst": true, "contentType": true,
	"eventRecordQPS": true, "eventBurst": true, "providerID": true, "podCIDR": true,
	"systemReserved": true, "kubeReserved": true,
	"cgroupRoot": true, "cgroupsPerQOS": true, "cpuCFSQuota": true, "cpuCFSQuotaPeriod": true, "podPidsLimit": true, "enforceNodeAllocatable": true,
	// The kubelet API server (server.go).
	"address": true, "port": true, "enableServer": true, "enableDebuggingHandlers": true,
	"tlsCertFile": true, "tlsPrivateKeyFile": true, "tlsCipherSuites": true, "tlsMinVersion": true,
	"authentication": true, "authorization": true,
	// The agent runs the cgroupfs driver only; "cgroupfs" is accepted, "systemd" refused.
	"cgroupDriver": true,
	// Verbosity comes from -v; the logging block's format must stay "text".
	"logging": true,
	// Client certificate rotation and the serving certificate CSR (join.go).
	"rotateCertificates": true, "serverTLSBootstrap": true,
	// Pod admission by securityContext.sysctls (sysctl.go).
	"allowedUnsafeSysctls": true,
	// Container log rotation (logrotate.go).
	"containerLogMaxSize": true, "containerLogMaxFiles": true, "containerLogMaxWorkers": true, "containerLogMonitorInterval": true,
	// Image garbage collection (imagegc.go).
	"imageGCHighThresholdPercent": true, "imageGCLowThresholdPercent": true, "imageMinimumGCAge": true, "imageMaximumGCAge": true,
}

// loadConfig reads a KubeletConfiguration file (YAML or JSON), refuses unknown or
// malformed fields naming them, and returns it with the kubelet's defaults applied,
// plus the names of the fields set in the file that this agent does not honour.
func loadConfig(path string) (*kubeletv1beta1.KubeletConfiguration, []string, error) {
	cfg := &kubeletv1beta1.KubeletConfiguration{}
	var ignored []string
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: read %s: %w", ErrInvalidConfig, path, err)
		}
		var err2 error
		cfg, ignored, err2 = decodeConfig(path, data)
		if err2 != nil {
			return nil, nil, err2
		}
	}
	setDefaults(cfg)
	return cfg, ignored, nil
}

func decodeConfig(path string, data []byte) (*kubeletv1beta1.KubeletConfiguration, []string, error) {
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, path, err)
	}
	if raw == nil {
		return nil, nil, fmt.Errorf("%w: %s: empty file", ErrInvalidConfig, path)
	}
	kind, _ := raw["kind"].(string)
	apiVersion, _ := raw["apiVersion"].(string)
	if kind != "KubeletConfiguration" || apiVersion != kubeletv1beta1.SchemeGroupVersion.String() {
		return nil, nil, fmt.Errorf("%w: %s: kind %q apiVersion %q: want kind KubeletConfiguration, apiVersion %s",
			ErrInvalidConfig, path, kind, apiVersion, kubeletv1beta1.SchemeGroupVersion)
	}
	cfg := &kubeletv1beta1.KubeletConfiguration{}
	// Strict: an unknown or misspelt field is an error naming it, as the kubelet's
	// strict decoding does, and a wrongly typed one names the field too.
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, path, err)
	}
	var ignored []string
	for k := range raw {
		if !honouredFields[k] {
			ignored = append(ignored, k)
		}
	}
	sort.Strings(ignored)
	return cfg, ignored, nil
}

// setDefaults fills the fields the upstream kubelet defaults
// (pkg/kubelet/apis/config/v1beta1/defaults.go) that this agent reads, with the same
// values, plus the Linux hard eviction thresholds when none are configured.
func setDefaults(c *kubeletv1beta1.KubeletConfiguration) {
	c.APIVersion = kubeletv1beta1.SchemeGroupVersion.String()
	c.Kind = "KubeletConfiguration"
	dur := func(d *metav1.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	if c.EnableServer == nil {
		c.EnableServer = ptr.To(true)
	}
	dur(&c.SyncFrequency, time.Minute)
	dur(&c.FileCheckFrequency, 20*time.Second)
	dur(&c.HTTPCheckFrequency, 20*time.Second)
	if c.Address == "" {
		c.Address = "0.0.0.0"
	}
	if c.Port == 0 {
		c.Port = defaultKubeletPort
	}
	if c.Authentication.Anonymous.Enabled == nil {
		c.Authentication.Anonymous.Enabled = ptr.To(false)
	}
	if c.Authentication.Webhook.Enabled == nil {
		c.Authentication.Webhook.Enabled = ptr.To(true)
	}
	dur(&c.Authentication.Webhook.CacheTTL, 2*time.Minute)
	if c.Authorization.Mode == "" {
		c.Authorization.Mode = kubeletv1beta1.KubeletAuthorizationModeWebhook
	}
	dur(&c.Authorization.Webhook.CacheAuthorizedTTL, 5*time.Minute)
	dur(&c.Authorization.Webhook.CacheUnauthorizedTTL, 30*time.Second)
	if c.EnableDebuggingHandlers == nil {
		c.EnableDebuggingHandlers = ptr.To(true)
	}
	if c.HealthzPort == nil {
		c.HealthzPort = ptr.To[int32](defaultHealthzPort)
	}
	if c.HealthzBindAddress == "" {
		c.HealthzBindAddress = "127.0.0.1"
	}
	if c.RegistryPullQPS == nil {
		c.RegistryPullQPS = ptr.To[int32](5)
	}
	if c.RegistryBurst == 0 {
		c.RegistryBurst = 10
	}
	if c.EventRecordQPS == nil {
		c.EventRecordQPS = ptr.To[int32](50)
	}
	if c.EventBurst == 0 {
		c.EventBurst = 100
	}
	// An explicit nodeStatusUpdateFrequency also becomes the report frequency when
	// the latter is unset, for backward compatibility, as upstream does.
	if c.NodeStatusReportFrequency.Duration == 0 {
		if c.NodeStatusUpdateFrequency.Duration == 0 {
			c.NodeStatusReportFrequency.Duration = 5 * time.Minute
		} else {
			c.NodeStatusReportFrequency = c.NodeStatusUpdateFrequency
		}
	}
	dur(&c.NodeStatusUpdateFrequency, 10*time.Second)
	if c.NodeLeaseDurationSeconds == 0 {
		c.NodeLeaseDurationSeconds = defaultLeaseDuration
	}
	if c.CgroupsPerQOS == nil {
		c.CgroupsPerQOS = ptr.To(true)
	}
	if c.CgroupDriver == "" {
		c.CgroupDriver = "cgroupfs"
	}
	dur(&c.RuntimeRequestTimeout, 2*time.Minute)
	if c.HairpinMode == "" {
		c.HairpinMode = kubeletv1beta1.PromiscuousBridge
	}
	if c.MaxPods == 0 {
		c.MaxPods = defaultMaxPods
	}
	if c.PodPidsLimit == nil || *c.PodPidsLimit < 0 {
		c.PodPidsLimit = ptr.To[int64](-1)
	}
	if c.ResolverConfig == nil {
		c.ResolverConfig = ptr.To(defaultResolvConf)
	}
	if c.CPUCFSQuota == nil {
		c.CPUCFSQuota = ptr.To(true)
	}
	if c.CPUCFSQuotaPeriod == nil {
		c.CPUCFSQuotaPeriod = &metav1.Duration{Duration: 100 * time.Millisecond}
	}
	if c.NodeStatusMaxImages == nil {
		c.NodeStatusMaxImages = ptr.To[int32](defaultMaxImages)
	}
	if c.ContentType == "" {
		c.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if c.KubeAPIQPS == nil {
		c.KubeAPIQPS = ptr.To[int32](50)
	}
	if c.KubeAPIBurst == 0 {
		c.KubeAPIBurst = 100
	}
	if c.SerializeImagePulls == nil {
		c.SerializeImagePulls = ptr.To(c.MaxParallelImagePulls == nil || *c.MaxParallelImagePulls < 2)
	}
	dur(&c.EvictionPressureTransitionPeriod, 5*time.Minute)
	if c.EvictionHard == nil {
		c.EvictionHard = map[string]string{}
		for k, v := range defaultEvictionHard {
			c.EvictionHard[k] = v
		}
	}
	if c.EnableControllerAttachDetach == nil {
		c.EnableControllerAttachDetach = ptr.To(true)
	}
	if c.FailSwapOn == nil {
		c.FailSwapOn = ptr.To(true)
	}
	if c.ContainerLogMaxSize == "" {
		c.ContainerLogMaxSize = "10Mi"
	}
	if c.ContainerLogMaxFiles == nil {
		c.ContainerLogMaxFiles = ptr.To[int32](5)
	}
	dur(&c.ImageMinimumGCAge, 2*time.Minute)
	if c.ImageGCHighThresholdPercent == nil {
		c.ImageGCHighThresholdPercent = ptr.To[int32](85)
	}
	if c.ImageGCLowThresholdPercent == nil {
		c.ImageGCLowThresholdPercent = ptr.To[int32](80)
	}
	if c.ContainerLogMaxWorkers == nil {
		c.ContainerLogMaxWorkers = ptr.To[int32](1)
	}
	if c.ContainerLogMonitorInterval == nil {
		c.ContainerLogMonitorInterval = &metav1.Duration{Duration: 10 * time.Second}
	}
	if c.RegisterNode == nil {
		c.RegisterNode = ptr.To(true)
	}
	if c.LocalStorageCapacityIsolation == nil {
		c.LocalStorageCapacityIsolation = ptr.To(true)
	}
	if c.ContainerRuntimeEndpoint == "" {
		c.ContainerRuntimeEndpoint = defaultEndpoint
	}
	if c.PodLogsDir == "" {
		c.PodLogsDir = defaultPodLogsDir
	}
	if c.Logging.Format == "" {
		c.Logging.Format = "text"
	}
}

// validateConfig checks the fields this agent reads, naming the field at fault.
func validateConfig(c *kubeletv1beta1.KubeletConfiguration) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p := *c.HealthzPort; p < 0 || p > 65535 {
		bad("healthzPort (--healthz-port) %d must be between 0 and 65535, inclusive", p)
	}
	if p := c.Port; p < 1 || p > 65535 {
		bad("port (--port) %d must be between 1 and 65535, inclusive", p)
	}
	if net.ParseIP(c.Address) == nil {
		bad("address %q is not a valid IP address", c.Address)
	}
	if _, err := cliflag.TLSCipherSuites(c.TLSCipherSuites); err != nil {
		bad("tlsCipherSuites: %v", err)
	}
	if _, err := cliflag.TLSVersion(c.TLSMinVersion); err != nil {
		bad("tlsMinVersion: %v", err)
	}
	if (c.TLSCertFile == "") != (c.TLSPrivateKeyFile == "") {
		bad("tlsCertFile %q and tlsPrivateKeyFile %q must be set together", c.TLSCertFile, c.TLSPrivateKeyFile)
	}
	switch c.Authorization.Mode {
	case kubeletv1beta1.KubeletAuthorizationModeWebhook, kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow:
	default:
		bad("authorization.mode %q: unknown authorization mode (want %s or %s)", c.Authorization.Mode,
			kubeletv1beta1.KubeletAuthorizationModeWebhook, kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"authentication.webhook.cacheTTL", c.Authentication.Webhook.CacheTTL.Duration},
		{"authorization.webhook.cacheAuthorizedTTL", c.Authorization.Webhook.CacheAuthorizedTTL.Duration},
		{"authorization.webhook.cacheUnauthorizedTTL", c.Authorization.Webhook.CacheUnauthorizedTTL.Duration},
	} {
		if d.v < 0 {
			bad("%s %v must not be negative", d.name, d.v)
		}
	}
	// The kubelet's checks of the log rotation fields (validation.go and
	// NewContainerLogManager), with its words.
	if *c.ContainerLogMaxWorkers < 1 {
		bad("invalid configuration: containerLogMaxWorkers must be greater than or equal to 1")
	}
	if c.ContainerLogMonitorInterval.Duration.Seconds() < 3 {
		bad("invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s")
	}
	if *c.ContainerLogMaxFiles <= 1 {
		bad("invalid configuration: containerLogMaxFiles must be greater than 1")
	}
	if _, err := parseLogMaxSize(c.ContainerLogMaxSize); err != nil {
		bad("containerLogMaxSize: failed to parse container log max size %q: %v", c.ContainerLogMaxSize, err)
	}
	// The kubelet's checks of the image GC fields, with its words.
	high, low := *c.ImageGCHighThresholdPercent, *c.ImageGCLowThresholdPercent
	if high < 0 || high > 100 {
		bad("invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) %v must be between 0 and 100, inclusive", high)
	}
	if low < 0 || low > 100 {
		bad("invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) %v must be between 0 and 100, inclusive", low)
	}
	if low >= high {
		bad("invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) %v must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) %v", low, high)
	}
	if c.ImageMinimumGCAge.Duration < 0 {
		bad("invalid configuration: imageMinimumGCAge %v must not be negative", c.ImageMinimumGCAge.Duration)
	}
	if c.ImageMaximumGCAge.Duration < 0 {
		bad("invalid configuration: imageMaximumGCAge %v must not be negative", c.ImageMaximumGCAge.Duration)
	}
	if c.ImageMaximumGCAge.Duration > 0 && c.ImageMaximumGCAge.Duration <= c.ImageMinimumGCAge.Duration {
		bad("invalid configuration: imageMaximumGCAge %v must be greater than imageMinimumGCAge %v", c.ImageMaximumGCAge.Duration, c.ImageMinimumGCAge.Duration)
	}
	if net.ParseIP(c.HealthzBindAddress) == nil {
		bad("healthzBindAddress %q is not a valid IP address", c.HealthzBindAddress)
	}
	if c.NodeStatusUpdateFrequency.Duration <= 0 {
		bad("nodeStatusUpdateFrequency (--node-status-update-frequency) %v must be > 0", c.NodeStatusUpdateFrequency.Duration)
	}
	if c.NodeStatusReportFrequency.Duration <= 0 {
		bad("nodeStatusReportFrequency %v must be > 0", c.NodeStatusReportFrequency.Duration)
	}
	if c.NodeLeaseDurationSeconds <= 0 {
		bad("nodeLeaseDurationSeconds %d must be > 0", c.NodeLeaseDurationSeconds)
	}
	if c.MaxPods < 0 {
		bad("maxPods (--max-pods) %d must not be a negative number", c.MaxPods)
	}
	if c.SyncFrequency.Duration <= 0 {
		bad("syncFrequency (--sync-frequency) %v must be > 0", c.SyncFrequency.Duration)
	}
	if c.FileCheckFrequency.Duration <= 0 {
		bad("fileCheckFrequency (--file-check-frequency) %v must be > 0", c.FileCheckFrequency.Duration)
	}
	if c.CgroupDriver != "cgroupfs" {
		bad("cgroupDriver %q is not supported by nodekit's kubelet (only \"cgroupfs\")", c.CgroupDriver)
	}
	if c.Logging.Format != "text" {
		bad("logging.format %q is not supported by nodekit's kubelet (only \"text\")", c.Logging.Format)
	}
	for i, ip := range c.ClusterDNS {
		if net.ParseIP(ip) == nil {
			bad("clusterDNS[%d] %q is not a valid IP address", i, ip)
		}
	}
	if c.ClusterDomain != "" {
		for _, msg := range validation.IsDNS1123Subdomain(c.ClusterDomain) {
			bad("clusterDomain %q: %s", c.ClusterDomain, msg)
		}
	}
	if _, err := newEvictionConfig(c); err != nil {
		bad("%v", err)
	}
	for i, t := range c.RegisterWithTaints {
		if err := validateTaint(t); err != nil {
			bad("registerWithTaints[%d]: %v", i, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// parseTaints parses --register-with-taints: comma-separated key[=value]:Effect.
func parseTaints(spec string) ([]corev1.Taint, error) {
	var out []corev1.Taint
	for s := range strings.SplitSeq(spec, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		keyValue, effect, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("invalid taint spec %q: want key=value:Effect or key:Effect", s)
		}
		key, value, _ := strings.Cut(keyValue, "=")
		t := corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}
		if err := validateTaint(t); err != nil {
			return nil, fmt.Errorf("invalid taint spec %q: %w", s, err)
		}
		out = append(out, t)
	}
	return out, nil
}

func validateTaint(t corev1.Taint) error {
	if msgs := validation.IsQualifiedName(t.Key); len(msgs) > 0 {
		return fmt.Errorf("key %q: %s", t.Key, strings.Join(msgs, "; "))
	}
	if t.Value != "" {
		if msgs := validation.IsValidLabelValue(t.Value); len(msgs) > 0 {
			return fmt.Errorf("value %q: %s", t.Value, strings.Join(msgs, "; "))
		}
	}
	switch t.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		return nil
	}
	return fmt.Errorf("invalid taint effect %q, unsupported taint effect", t.Effect)
}

// kubeletLabelNamespaces and kubeletLabels are what --node-labels may set in the
// kubernetes.io and k8s.io namespaces (k8s.io/kubelet/pkg/apis: KubeletLabels,
// KubeletLabelNamespaces); NodeRestriction forbids the rest to a node.
var (
	kubeletLabelNamespaces = []string{"kubelet.kubernetes.io", "node.kubernetes.io"}
	kubeletLabels          = []string{
		"kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
		"failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
		"kubernetes.io/arch", "kubernetes.io/os", "beta.kubernetes.io/arch", "beta.kubernetes.io/os",
		"node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type",
	}
)

// parseNodeLabels parses --node-labels (key=value,...) and refuses labels in the
// kubernetes.io / k8s.io namespaces that a kubelet may not set, as the kubelet does.
func parseNodeLabels(spec string) (map[string]string, error) {
	out := map[string]string{}
	var unknown []string
	for s := range strings.SplitSeq(spec, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("invalid --node-labels entry %q: want key=value", s)
		}
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return nil, fmt.Errorf("invalid node label key %q: %s", k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return nil, fmt.Errorf("invalid node label value %q for %q: %s", v, k, strings.Join(msgs, "; "))
		}
		if !allowedNodeLabel(k) {
			unknown = append(unknown, k)
		}
		out[k] = v
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: %v\n"+
			"--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix (%s) or be in the specifically allowed set (%s)",
			unknown, strings.Join(kubeletLabelNamespaces, ", "), strings.Join(kubeletLabels, ", "))
	}
	return out, nil
}

func allowedNodeLabel(key string) bool {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return true
	}
	ns = strings.ToLower(ns)
	if ns != "kubernetes.io" && !strings.HasSuffix(ns, ".kubernetes.io") && ns != "k8s.io" && !strings.HasSuffix(ns, ".k8s.io") {
		return true
	}
	if slices.Contains(kubeletLabels, key) {
		return true
	}
	for _, allowed := range kubeletLabelNamespaces {
		if ns == allowed || strings.HasSuffix(ns, "."+allowed) {
			return true
		}
	}
	return false
}
