package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// sysctlRouteLocalnet lets the kernel route packets with a 127.0.0.0/8 source off
// the host: localhost NodePorts in iptables mode need it (upstream's name).
const sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"

// sysctlRoot is where sysctls are read and written; tests point it elsewhere.
var sysctlRoot = "/proc/sys"

// ensureSysctl is upstream's proxyutil.EnsureSysctl: it writes val unless the
// sysctl already holds it. /proc/sys/net belongs to the network namespace of the
// thread that opens it, so called on the node namespace's thread it sets the
// node's value.
func ensureSysctl(logger klog.Logger, name string, val int) error {
	path := filepath.Join(sysctlRoot, name)
	old := -1
	if b, err := os.ReadFile(path); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			old = v
		}
	}
	if old == val {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(val)), 0o640); err != nil {
		return fmt.Errorf("can't set sysctl %s to %d: %w", name, val, err)
	}
	logger.V(1).Info("Changed sysctl", "name", name, "before", old, "after", val)
	return nil
}
