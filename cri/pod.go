package cri

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/dump"
)

// Labels the kubelet puts on every sandbox and container; crictl pods/ps read them to
// show pod name, namespace and container name.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
)

// Annotations the kubelet puts on every container.
const (
	AnnotationContainerHash            = "io.kubernetes.container.hash"
	AnnotationRestartCount             = "io.kubernetes.container.restartCount"
	AnnotationTerminationMessagePath   = "io.kubernetes.container.terminationMessagePath"
	AnnotationTerminationMessagePolicy = "io.kubernetes.container.terminationMessagePolicy"
	AnnotationPreStopHandler           = "io.kubernetes.container.preStopHandler"
	AnnotationContainerPorts           = "io.kubernetes.container.ports"
	AnnotationDeletionGracePeriod      = "io.kubernetes.pod.deletionGracePeriod"
	AnnotationTerminationGracePeriod   = "io.kubernetes.pod.terminationGracePeriod"
)

// DefaultPodLogsDir is the kubelet's pod logs root.
const DefaultPodLogsDir = "/var/log/pods"

// PodOptions are the node-side inputs to PodSandboxConfig and ContainerConfig that the
// Pod object does not carry.
type PodOptions struct {
	// LogsDir is the pod logs root. Default DefaultPodLogsDir.
	LogsDir string
	// Attempt is the sandbox attempt: 0 for the first sandbox, +1 for each re-creation.
	Attempt uint32
	// CgroupParent is the pod's cgroup (the kubelet's pod-level cgroup). Default: the
	// runtime's choice.
	CgroupParent string
	// DNS is the pod's resolv.conf content. Default: the runtime's (the node's).
	DNS *runtimeapi.DNSConfig
	// ClusterDomain, when set, makes a pod with subdomain and setHostnameAsFQDN use its
	// FQDN as hostname, as the kubelet does with --cluster-domain.
	ClusterDomain string
}

func (o PodOptions) logsDir() string {
	if o.LogsDir == "" {
		return DefaultPodLogsDir
	}
	return o.LogsDir
}

// PodLogsDirectory is where the kubelet keeps a pod's logs:
// <logsDir>/<namespace>_<name>_<uid>.
func PodLogsDirectory(logsDir string, pod *corev1.Pod) string {
	return filepath.Join(logsDir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID))
}

// ContainerLogPath is a container's log path relative to its pod's log directory:
// <container>/<restartCount>.log.
func ContainerLogPath(container string, restartCount int) string {
	return filepath.Join(container, strconv.Itoa(restartCount)+".log")
}

func validatePod(pod *corev1.Pod) error {
	if pod == nil {
		return fmt.Errorf("%w: nil pod", ErrInvalidPod)
	}
	if pod.Name == "" || pod.Namespace == "" || pod.UID == "" {
		return fmt.Errorf("%w %q: name, namespace and uid are required (got name=%q namespace=%q uid=%q)",
			ErrInvalidPod, pod.Namespace+"/"+pod.Name, pod.Name, pod.Namespace, pod.UID)
	}
	return nil
}

// PodSandboxConfig builds the sandbox config the kubelet would send for pod: metadata,
// the pod's labels plus the io.kubernetes.pod.* labels, the pod's annotations,
// hostname (not for host-network pods), log directory, port mappings and the Linux
// namespaces and security settings. Volumes, resources and DNS policy are the caller's
// (see PodOptions).
func PodSandboxConfig(pod *corev1.Pod, opts PodOptions) (*runtimeapi.PodSandboxConfig, error) {
	if err := validatePod(pod); err != nil {
		return nil, err
	}
	labels := make(map[string]string, len(pod.Labels)+3)
	for k, v := range pod.Labels {
		labels[k] = v
	}
	labels[LabelPodName] = pod.Name
	labels[LabelPodNamespace] = pod.Namespace
	labels[LabelPodUID] = string(pod.UID)

	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name:      pod.Name,
			Namespace: pod.Namespace,
			Uid:       string(pod.UID),
			Attempt:   opts.Attempt,
		},
		Labels:       labels,
		Annotations:  copyMap(pod.Annotations),
		LogDirectory: PodLogsDirectory(opts.logsDir(), pod),
		DnsConfig:    opts.DNS,
	}
	if !pod.Spec.HostNetwork {
		hostname, err := podHostname(pod, opts.ClusterDomain)
		if err != nil {
			return nil, err
		}
		cfg.Hostname = hostname
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			cfg.PortMappings = append(cfg.PortMappings, &runtimeapi.PortMapping{
				Protocol:      protocol(p.Protocol),
				ContainerPort: p.ContainerPort,
				HostPort:      p.HostPort,
				HostIp:        p.HostIP,
			})
		}
	}

	sc := &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: namespaces(pod),
		Privileged:       anyPrivileged(pod),
		// The kubelet runs every sandbox under the runtime's default seccomp profile.
		Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
	}
	sysctls := map[string]string{}
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			sc.RunAsUser = &runtimeapi.Int64Value{Value: *psc.RunAsUser}
		}
		if psc.RunAsGroup != nil {
			sc.RunAsGroup = &runtimeapi.Int64Value{Value: *psc.RunAsGroup}
		}
		if psc.FSGroup != nil {
			sc.SupplementalGroups = append(sc.SupplementalGroups, *psc.FSGroup)
		}
		sc.SupplementalGroups = append(sc.SupplementalGroups, psc.SupplementalGroups...)
		// The kubelet hands the runtime dot-separated names: kernel/shm_rmid_forced
		// becomes kernel.shm_rmid_forced, as sysctl.d(5) reads them.
		for _, s := range psc.Sysctls {
			sysctls[utilsysctl.NormalizeName(s.Name)] = s.Value
		}
	}
	cfg.Linux = &runtimeapi.LinuxPodSandboxConfig{CgroupParent: opts.CgroupParent, SecurityContext: sc, Sysctls: sysctls}
	return cfg, nil
}

// ContainerConfig builds the config the kubelet would send to create the named
// container of pod: metadata with the restart count as attempt, the four
// io.kubernetes.* labels, the kubelet's annotations (hash, restart count, termination
// message path and policy, grace periods, preStop handler and ports as JSON), the log
// path <name>/<restartCount>.log, command and args with $(VAR) references expanded
// from the container's literal env, the Linux resources (CPU shares, CFS quota and
// period, memory limit, computed as the kubelet does) and the Linux security settings
// (user, group, supplemental groups, privileged, read-only root, capabilities,
// no_new_privs). imageRef is the resolved image (PullImage's answer); "" sends the
// container's image as written. Env entries with valueFrom, volume mounts, devices,
// the OOM score adjustment, seccomp/AppArmor/SELinux and masked /proc paths are left
// to the caller. name may be an init, app or ephemeral container's; an ephemeral
// container's targetContainerName (the PID namespace of another container) needs
// that container's runtime ID, which the caller sets (NamespaceMode_TARGET).
func ContainerConfig(pod *corev1.Pod, name string, restartCount int, imageRef string) (*runtimeapi.ContainerConfig, error) {
	if err := validatePod(pod); err != nil {
		return nil, err
	}
	var container *corev1.Container
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			container = &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			container = &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if pod.Spec.EphemeralContainers[i].Name == name {
			container = (*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		}
	}
	if container == nil {
		return nil, fmt.Errorf("%w %q: no container named %q", ErrInvalidPod, pod.Namespace+"/"+pod.Name, name)
	}
	if restartCount < 0 {
		return nil, fmt.Errorf("%w %q: negative restart count %d for container %q", ErrInvalidPod, pod.Namespace+"/"+pod.Name, restartCount, name)
	}
	if imageRef == "" {
		imageRef = container.Image
	}

	env := map[string]string{}
	var envs []*runtimeapi.KeyValue
	index := map[string]int{} // name -> position in envs
	for _, e := range container.Env {
		if e.ValueFrom != nil {
			continue
		}
		v := expand(e.Value, env)
		env[e.Name] = v
		// A name given twice gets its last value, as in the kubelet (which keys env
		// by name).
		if i, ok := index[e.Name]; ok {
			envs[i].Value = []byte(v)
			continue
		}
		index[e.Name] = len(envs)
		envs = append(envs, &runtimeapi.KeyValue{Key: e.Name, Value: []byte(v)})
	}
	command := make([]string, 0, len(container.Command))
	for _, s := range container.Command {
		command = append(command, expand(s, env))
	}
	args := make([]string, 0, len(container.Args))
	for _, s := range container.Args {
		args = append(args, expand(s, env))
	}

	annotations := map[string]string{
		AnnotationContainerHash:            strconv.FormatUint(ContainerHash(container), 16),
		AnnotationRestartCount:             strconv.Itoa(restartCount),
		AnnotationTerminationMessagePath:   container.TerminationMessagePath,
		AnnotationTerminationMessagePolicy: string(container.TerminationMessagePolicy),
	}
	if pod.DeletionGracePeriodSeconds != nil {
		annotations[AnnotationDeletionGracePeriod] = strconv.FormatInt(*pod.DeletionGracePeriodSeconds, 10)
	}
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		annotations[AnnotationTerminationGracePeriod] = strconv.FormatInt(*pod.Spec.TerminationGracePeriodSeconds, 10)
	}
	if container.Lifecycle != nil && container.Lifecycle.PreStop != nil {
		if b, err := json.Marshal(container.Lifecycle.PreStop); err == nil {
			annotations[AnnotationPreStopHandler] = string(b)
		}
	}
	if len(container.Ports) > 0 {
		if b, err := json.Marshal(container.Ports); err == nil {
			annotations[AnnotationContainerPorts] = string(b)
		}
	}

	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: container.Name, Attempt: uint32(restartCount)},
		Image:    &runtimeapi.ImageSpec{Image: imageRef, UserSpecifiedImage: container.Image},
		Command:  command,
		Args:     args,
		Labels: map[string]string{
			LabelPodName:       pod.Name,
			LabelPodNamespace:  pod.Namespace,
			LabelPodUID:        string(pod.UID),
			LabelContainerName: container.Name,
		},
		Annotations: annotations,
		WorkingDir:  container.WorkingDir,
		Envs:        envs,
		LogPath:     ContainerLogPath(container.Name, restartCount),
		Stdin:       container.Stdin,
		StdinOnce:   container.StdinOnce,
		Tty:         container.TTY,
	}
	sc := &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: namespaces(pod)}
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			sc.RunAsUser = &runtimeapi.Int64Value{Value: *psc.RunAsUser}
		}
		if psc.RunAsGroup != nil {
			sc.RunAsGroup = &runtimeapi.Int64Value{Value: *psc.RunAsGroup}
		}
		if psc.FSGroup != nil {
			sc.SupplementalGroups = append(sc.SupplementalGroups, *psc.FSGroup)
		}
		sc.SupplementalGroups = append(sc.SupplementalGroups, psc.SupplementalGroups...)
	}
	if csc := container.SecurityContext; csc != nil {
		if csc.Privileged != nil {
			sc.Privileged = *csc.Privileged
		}
		if csc.RunAsUser != nil {
			sc.RunAsUser = &runtimeapi.Int64Value{Value: *csc.RunAsUser}
		}
		if csc.RunAsGroup != nil {
			sc.RunAsGroup = &runtimeapi.Int64Value{Value: *csc.RunAsGroup}
		}
		if csc.ReadOnlyRootFilesystem != nil {
			sc.ReadonlyRootfs = *csc.ReadOnlyRootFilesystem
		}
		// Only an explicit allowPrivilegeEscalation: false sets no_new_privs.
		if csc.AllowPrivilegeEscalation != nil {
			sc.NoNewPrivs = !*csc.AllowPrivilegeEscalation
		}
		if caps := csc.Capabilities; caps != nil {
			sc.Capabilities = &runtimeapi.Capability{}
			for _, c := range caps.Add {
				sc.Capabilities.AddCapabilities = append(sc.Capabilities.AddCapabilities, string(c))
			}
			for _, c := range caps.Drop {
				sc.Capabilities.DropCapabilities = append(sc.Capabilities.DropCapabilities, string(c))
			}
		}
	}
	cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: containerResources(container), SecurityContext: sc}
	return cfg, nil
}

// The kubelet's CPU conversions (pkg/kubelet/cm): cgroup v1 cpu.shares and the CFS
// quota over its default period.
const (
	minCPUShares    = 2
	maxCPUShares    = 262144
	cpuSharesPerCPU = 1024
	// CFSQuotaPeriod is the CFS period, in microseconds, the kubelet gives every
	// container (100 ms; --cpu-cfs-quota-period is behind a feature gate).
	CFSQuotaPeriod = 100000
	minCFSQuota    = 1000 // 1 ms, the kernel's minimum
)

// containerResources computes what the kubelet sends for a container's cgroup, with
// its default --cpu-cfs-quota=true: cpu.shares from the CPU request (the limit when
// there is no request; 2 when neither), the CFS quota from the CPU limit (0: none)
// over a 100 ms period, and the memory limit. The OOM score, hugepages, swap and
// cgroup v2 unified settings depend on the node and are left to the caller.
func containerResources(c *corev1.Container) *runtimeapi.LinuxContainerResources {
	cpuLimit := c.Resources.Limits.Cpu().MilliValue()
	cpuRequest := cpuLimit
	if q, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
		cpuRequest = q.MilliValue()
	}
	return &runtimeapi.LinuxContainerResources{
		CpuShares:          milliCPUToShares(cpuRequest),
		CpuQuota:           milliCPUToQuota(cpuLimit, CFSQuotaPeriod),
		CpuPeriod:          CFSQuotaPeriod,
		MemoryLimitInBytes: c.Resources.Limits.Memory().Value(),
	}
}

// ContainerResources is the Linux resources ContainerConfig gives container c,
// for UpdateContainerResources when the container is resized in place.
func ContainerResources(c *corev1.Container) *runtimeapi.LinuxContainerResources {
	return containerResources(c)
}

// milliCPUToShares: 1024 shares per CPU, clamped to [2, 262144]; no request gets 2.
func milliCPUToShares(milliCPU int64) int64 {
	shares := milliCPU * cpuSharesPerCPU / 1000
	return min(max(shares, minCPUShares), maxCPUShares)
}

// milliCPUToQuota: the share of period (µs) the limit allows, at least 1 ms; no limit
// gives 0 (unlimited).
func milliCPUToQuota(milliCPU, period int64) int64 {
	if milliCPU == 0 {
		return 0
	}
	return max(milliCPU*period/1000, minCFSQuota)
}

// ContainerHash is the kubelet's io.kubernetes.container.hash: FNV-32a over the
// apimachinery hash dump of the JSON of the container's name and image (the fields
// whose change makes the kubelet restart a container). A kubelet that takes over the
// node sees the same hash and leaves the container alone.
func ContainerHash(c *corev1.Container) uint64 {
	b, _ := json.Marshal(map[string]string{"name": c.Name, "image": c.Image})
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(b))
	return uint64(h.Sum32())
}

func namespaces(pod *corev1.Pod) *runtimeapi.NamespaceOption {
	ns := &runtimeapi.NamespaceOption{
		Network: runtimeapi.NamespaceMode_POD,
		Pid:     runtimeapi.NamespaceMode_CONTAINER,
		Ipc:     runtimeapi.NamespaceMode_POD,
	}
	if pod.Spec.HostNetwork {
		ns.Network = runtimeapi.NamespaceMode_NODE
	}
	if pod.Spec.HostIPC {
		ns.Ipc = runtimeapi.NamespaceMode_NODE
	}
	switch {
	case pod.Spec.HostPID:
		ns.Pid = runtimeapi.NamespaceMode_NODE
	case pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace:
		ns.Pid = runtimeapi.NamespaceMode_POD
	}
	return ns
}

func anyPrivileged(pod *corev1.Pod) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
				return true
			}
		}
	}
	return false
}

func protocol(p corev1.Protocol) runtimeapi.Protocol {
	switch p {
	case corev1.ProtocolUDP:
		return runtimeapi.Protocol_UDP
	case corev1.ProtocolSCTP:
		return runtimeapi.Protocol_SCTP
	}
	return runtimeapi.Protocol_TCP
}

// podHostname follows the kubelet: spec.hostnameOverride as it is, else spec.hostname or the pod name, cut to 63 bytes
// without a trailing '-' or '.'; with setHostnameAsFQDN and a subdomain, the FQDN
// <hostname>.<subdomain>.<namespace>.svc.<clusterDomain>, at most 64 bytes.
func podHostname(pod *corev1.Pod, clusterDomain string) (string, error) {
	if o := pod.Spec.HostnameOverride; o != nil {
		// spec.hostnameOverride (GA in 1.37) wins and never gets a domain, so no FQDN.
		return truncateHostname(*o), nil
	}
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	hostname = truncateHostname(hostname)
	if pod.Spec.SetHostnameAsFQDN != nil && *pod.Spec.SetHostnameAsFQDN && pod.Spec.Subdomain != "" && clusterDomain != "" {
		fqdn := fmt.Sprintf("%s.%s.%s.svc.%s", hostname, pod.Spec.Subdomain, pod.Namespace, clusterDomain)
		if len(fqdn) > 64 {
			return "", fmt.Errorf("%w %q: FQDN %q is longer than 64 bytes", ErrInvalidPod, pod.Namespace+"/"+pod.Name, fqdn)
		}
		return fqdn, nil
	}
	return hostname, nil
}

// truncateHostname cuts a hostname to 63 bytes without a trailing '-' or '.', as the
// kubelet's truncatePodHostnameIfNeeded.
func truncateHostname(h string) string {
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// expand replaces $(NAME) with env's value, "$$" with "$", and leaves unknown
// references as written: the kubelet's rules for command, args and env values.
func expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok && name != "" {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
