package main

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	"k8s.io/klog/v2"
)

// reasonSysctlForbidden is the reason a pod asking for a sysctl the node does not
// allow is rejected with (the kubelet's sysctl.ForbiddenReason).
const reasonSysctlForbidden = "SysctlForbidden"

// safeSysctls are the sysctls the kubelet always allows (pkg/kubelet/sysctl), with
// the kernel version from which each is namespaced, where that matters.
var safeSysctls = []struct{ name, kernel string }{
	{"kernel.shm_rmid_forced", ""},
	{"net.ipv4.ip_local_port_range", ""},
	{"net.ipv4.tcp_syncookies", ""},
	{"net.ipv4.ping_group_range", ""},
	{"net.ipv4.ip_unprivileged_port_start", ""},
	{"net.ipv4.ip_local_reserved_ports", "3.16"},
	{"net.ipv4.tcp_keepalive_time", "4.5"},
	{"net.ipv4.tcp_fin_timeout", "4.6"},
	{"net.ipv4.tcp_keepalive_intvl", "4.5"},
	{"net.ipv4.tcp_keepalive_probes", "4.5"},
	{"net.ipv4.tcp_rmem", "4.15"},
	{"net.ipv4.tcp_wmem", "4.15"},
	{"net.ipv4.tcp_slow_start_after_idle", "4.15"},
	{"net.ipv4.tcp_notsent_lowat", "4.6"},
}

// safeSysctlList is safeSysctls for a node running kernel (uname's release); the
// version-bound ones are left out when it does not parse, as the kubelet does.
func safeSysctlList(kernel string) []string {
	v, err := version.ParseGeneric(strings.TrimSpace(kernel))
	if err != nil {
		klog.ErrorS(err, "failed to get kernel version, unable to determine which sysctls are available")
	}
	var out []string
	for _, s := range safeSysctls {
		if s.kernel == "" || (v != nil && v.AtLeast(version.MustParseGeneric(s.kernel))) {
			out = append(out, s.name)
			continue
		}
		klog.InfoS("kernel version is too old, dropping the sysctl from safe sysctl list", "kernelVersion", v, "sysctl", s.name)
	}
	return out
}

// sysctlPatternFmt is the policy API's SysctlContainSlashPatternFmt: dot or
// slash separated segments, the last of which may end in '*'.
const sysctlPatternFmt = `([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]`

var sysctlPattern = regexp.MustCompile("^" + sysctlPatternFmt + "$")

// sysctlAllowlist admits pods by their securityContext.sysctls, as the kubelet's
// patternAllowlist admit handler: each sysctl must be allowed by name or by a
// `prefix*` pattern, and one in the network, IPC or user namespace may not be
// set in a pod sharing that namespace with the host. A nil allowlist allows none.
type sysctlAllowlist struct {
	sysctls  map[string]utilsysctl.Namespace
	prefixes map[string]utilsysctl.Namespace
}

// newSysctlAllowlist builds the allowlist from the safe sysctls and the
// configuration's allowedUnsafeSysctls; a pattern that is malformed or names no
// namespaced sysctl is an error naming it.
func newSysctlAllowlist(patterns []string) (*sysctlAllowlist, error) {
	w := &sysctlAllowlist{sysctls: map[string]utilsysctl.Namespace{}, prefixes: map[string]utilsysctl.Namespace{}}
	for _, p := range patterns {
		if len(p) > 253 || !sysctlPattern.MatchString(p) {
			return nil, fmt.Errorf("%w: allowedUnsafeSysctls: sysctl %q must have at most 253 characters and match regex %s",
				ErrInvalidConfig, p, sysctlPatternFmt)
		}
		ns, name, prefixed := utilsysctl.GetNamespace(p)
		if ns == utilsysctl.UnknownNamespace {
			return nil, fmt.Errorf("%w: allowedUnsafeSysctls: the sysctls %q are not known to be namespaced", ErrInvalidConfig, name)
		}
		if prefixed {
			w.prefixes[name] = ns
		} else {
			w.sysctls[name] = ns
		}
	}
	return w, nil
}

// newPodSysctlAllowlist is the kubelet's: the safe sysctls for the node's
// kernel plus allowedUnsafeSysctls.
func newPodSysctlAllowlist(cfg podManagerConfig) (*sysctlAllowlist, error) {
	m := newMachine()
	if cfg.node != nil && cfg.node.machine != nil {
		m = cfg.node.machine
	}
	return newSysctlAllowlist(append(safeSysctlList(m.kernelVersion()), cfg.cfg.AllowedUnsafeSysctls...))
}

// check says why sysctl may not be set in pod, or nil.
func (w *sysctlAllowlist) check(sysctl string, pod *corev1.Pod) error {
	sysctl = utilsysctl.NormalizeName(sysctl)
	ns, found := utilsysctl.UnknownNamespace, false
	if w != nil {
		ns, found = w.sysctls[sysctl]
		if !found {
			for p, pns := range w.prefixes {
				if strings.HasPrefix(sysctl, p) {
					ns, found = pns, true
					break
				}
			}
		}
	}
	if !found {
		return fmt.Errorf("%q not allowlisted", sysctl)
	}
	hostUsers := pod.Spec.HostUsers == nil || *pod.Spec.HostUsers
	if (ns == utilsysctl.IPCNamespace && pod.Spec.HostIPC) ||
		(ns == utilsysctl.NetNamespace && pod.Spec.HostNetwork) ||
		(ns == utilsysctl.UserNamespace && hostUsers) {
		return fmt.Errorf("%q not allowed with host %s enabled", sysctl, ns)
	}
	return nil
}

// admit checks every sysctl of pod; a refusal carries the kubelet's reason and
// message ("forbidden sysctl: ...").
func (w *sysctlAllowlist) admit(pod *corev1.Pod) (reason, message string, ok bool) {
	if pod.Spec.SecurityContext == nil {
		return "", "", true
	}
	for _, s := range pod.Spec.SecurityContext.Sysctls {
		if err := w.check(s.Name, pod); err != nil {
			return reasonSysctlForbidden, fmt.Sprintf("forbidden sysctl: %v", err), false
		}
	}
	return "", "", true
}
